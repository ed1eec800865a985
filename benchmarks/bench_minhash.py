"""MinHash signature and LSH index speed: ours vs datasketch, side by side.

    .venv/bin/python benchmarks/bench_minhash.py [--docs 4000] [--repeat 5]

Everything runs single-threaded in one process (numpy does no threading for
these element-wise operations, and the numba kernels are not parallel; the
BLAS/OpenMP thread variables are set to 1 anyway; ``--pin`` also pins the
process to one CPU). Times are the CPU time
of the process (``time.process_time``), so other work on the machine does
not count against either side; the wall-clock median is printed beside it.
Every figure is the median of ``--repeat`` runs.

Documents: ``--docs`` synthetic English-like texts of about 2 KB (seeded
Zipf vocabulary, capitals and punctuation, so normalisation has work to do),
shingled with the default normaliser (`text/3`, `auto`: these texts are long, so
word 3-grams, about 340 shingles per document). Signatures: 128 permutations, seed 1, affine32, xxh32.

Two ways of counting, both printed:

* "from text": each side starts from the raw texts. Ours runs
  ``minhash_signatures_from_texts`` (what the near-duplicate rung runs: the
  shingles are slices of the normalised text, hashed by compiled code,
  never built one by one; the kernels are compiled before the clock starts);
  datasketch gets the normaliser's shingles from
  ``TextNormaliser.shingle_bytes`` and then its own signature path.
* "from shingles": each side starts from the same pre-computed lists of
  UTF-8 shingles (``bytes``, datasketch's documented input type); ours still
  hashes every shingle.

datasketch paths: ``MinHash.update`` once per shingle, and ``MinHash.bulk``
and ``MinHash.generator`` with ``hashfunc=xxhash.xxh32_intdigest`` (the
fastest hash function a caller can give it); the ratios use the faster of
the two. The script checks that all outputs are bit-identical.

LSH: insert all signatures, then query all, with our ``LshIndex`` and
datasketch's in-memory ``MinHashLSH`` at the same ``(bands, rows)``; the
candidate sets are checked to be equal. The LeanMinHash objects datasketch
needs are built outside the timing. The index's size in a warehouse (one
`near_index` row per record with its band-key indexes) is measured by
`bench_e2e.py`, not here.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402
import xxhash  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import LshIndex, at_least_one, cpu_and_wall  # noqa: E402
from dedup_pipeline.core.minhash import minhash_signatures, minhash_signatures_from_texts, to_lean_minhash  # noqa: E402
from dedup_pipeline.core.near import NearDupParams  # noqa: E402

NUM_PERM = 128
SEED = 1


def make_documents(count: int, size: int = 2000, seed: int = 7) -> list[str]:
    """Seeded English-like documents of about ``size`` characters."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    freq = np.array(
        [
            12.7,
            9.1,
            8.2,
            7.5,
            7.0,
            6.7,
            6.3,
            6.1,
            6.0,
            4.3,
            4.0,
            2.8,
            2.8,
            2.4,
            2.4,
            2.2,
            2.0,
            2.0,
            1.9,
            1.5,
            1.0,
            0.8,
            0.2,
            0.2,
            0.1,
            0.1,
        ]
    )
    lengths = np.clip(rng.poisson(4.0, 30000) + 1, 1, 14)
    vocab = ["".join(rng.choice(letters, n, p=freq / freq.sum())) for n in lengths]
    zipf = 1.0 / np.arange(1, len(vocab) + 1)
    zipf /= zipf.sum()
    docs = []
    for _ in range(count):
        words = rng.choice(len(vocab), 450, p=zipf)
        parts, length = [], 0
        for k, w in enumerate(words):
            word = vocab[w]
            if k % 11 == 0:
                word = word.capitalize()
            if k % 13 == 12:
                word += rng.choice([",", ".", ";", "!"])
            parts.append(word)
            length += len(word) + 1
            if length >= size:
                break
        docs.append(" ".join(parts))
    return docs


def median_time(fn, repeat: int) -> tuple[float, float]:
    """Median (CPU, wall) seconds of ``fn()``; the garbage collector is paused while timing, as timeit does."""
    cpu, wall = zip(*(cpu_and_wall(fn) for _ in range(repeat)))
    return statistics.median(cpu), statistics.median(wall)


def datasketch_update(shingle_lists):
    from datasketch import MinHash

    out = []
    for shingles in shingle_lists:
        m = MinHash(NUM_PERM, seed=SEED, hashfunc=xxhash.xxh32_intdigest)
        for s in shingles:
            m.update(s)
        out.append(m)
    return out


def datasketch_bulk(shingle_lists):
    from datasketch import MinHash

    return MinHash.bulk(shingle_lists, num_perm=NUM_PERM, seed=SEED, hashfunc=xxhash.xxh32_intdigest)


def datasketch_generator(shingle_lists):
    from datasketch import MinHash

    return list(MinHash.generator(shingle_lists, num_perm=NUM_PERM, seed=SEED, hashfunc=xxhash.xxh32_intdigest))


def bench_signatures(docs: list[str], repeat: int) -> None:
    normaliser = NearDupParams().normaliser
    shingles = [normaliser.shingle_bytes(t) for t in docs]
    n = len(docs)
    n_update = max(n // 10, 20)  # update() is ~100x slower: time a slice
    per_doc = np.mean([len(s) for s in shingles])
    print(
        f"documents: {n}, mean {np.mean([len(t.encode()) for t in docs]):.0f} bytes, "
        f"{per_doc:.0f} shingles ({normaliser.identity()})"
    )

    # Correctness first: every path gives the same signatures.
    ours = minhash_signatures(shingles, NUM_PERM, SEED)
    for m, row in zip(datasketch_bulk(shingles[:200]), ours):
        assert np.array_equal(m.hashvalues, row)
    for m, row in zip(datasketch_update(shingles[:20]), ours):
        assert np.array_equal(m.hashvalues, row)
    assert np.array_equal(minhash_signatures_from_texts(docs, normaliser, NUM_PERM, SEED), ours)
    print("bit-identical to datasketch affine32 (from shingles and from texts): yes")

    shingle_text = lambda: [normaliser.shingle_bytes(t) for t in docs]  # noqa: E731
    rows = {
        "ours            from text": (lambda: minhash_signatures_from_texts(docs, normaliser, NUM_PERM, SEED), n),
        "ours            from shingles": (lambda: minhash_signatures(shingles, NUM_PERM, SEED), n),
        "ds bulk         from text": (lambda: datasketch_bulk(shingle_text()), n),
        "ds generator    from text": (lambda: datasketch_generator(shingle_text()), n),
        "ds bulk         from shingles": (lambda: datasketch_bulk(shingles), n),
        "ds generator    from shingles": (lambda: datasketch_generator(shingles), n),
        "ds update       from text": (
            lambda: datasketch_update([normaliser.shingle_bytes(t) for t in docs[:n_update]]),
            n_update,
        ),
        "ds update       from shingles": (lambda: datasketch_update(shingles[:n_update]), n_update),
        "shingling only (shared)": (shingle_text, n),
    }
    rate = {}
    print(
        f"\n{'signatures (1 core, median of ' + str(repeat) + ')':40} {'docs/s':>10} {'us/doc':>9} {'ns/shingle':>11}"
        f" {'wall docs/s':>12}"
    )
    for name, (fn, count) in rows.items():
        cpu, wall = median_time(fn, repeat)
        seconds = cpu / count
        rate[name] = 1.0 / seconds
        print(f"{name:40} {rate[name]:10.0f} {seconds * 1e6:9.1f} {seconds * 1e9 / per_doc:11.1f} {count / wall:12.0f}")

    for basis in ("from text", "from shingles"):
        ours_rate = rate[f"ours            {basis}"]
        bulk = max(rate[f"ds bulk         {basis}"], rate[f"ds generator    {basis}"])
        update = rate[f"ds update       {basis}"]
        print(f"\n{basis}: ours {ours_rate:,.0f} docs/s (target >= 12,000: {'OK' if ours_rate >= 12000 else 'MISSED'})")
        print(
            f"  vs datasketch update per shingle: {ours_rate / update:6.1f}x (target >= 85x: "
            f"{'OK' if ours_rate / update >= 85 else 'MISSED'})"
        )
        print(
            f"  vs datasketch fastest bulk:       {ours_rate / bulk:6.2f}x (target >= 3.5x: "
            f"{'OK' if ours_rate / bulk >= 3.5 else 'MISSED'})"
        )
    return ours


def bench_lsh(signatures: np.ndarray, repeat: int) -> None:
    from datasketch import MinHashLSH

    params = NearDupParams()
    bands, rows = params.bands, params.rows
    n = len(signatures)
    ids = list(range(n))
    leans = [to_lean_minhash(s, SEED) for s in signatures]

    def ours():
        index = LshIndex(bands, rows)
        index.insert_many(ids, signatures)
        return index.query_many(signatures)

    def theirs():
        lsh = MinHashLSH(num_perm=NUM_PERM, params=(bands, rows))
        for i, m in zip(ids, leans):
            lsh.insert(i, m)
        return [set(lsh.query(m)) for m in leans]

    assert ours() == theirs(), "candidate sets differ"
    t_ours = median_time(ours, repeat)[0]
    t_theirs = median_time(theirs, repeat)[0]
    print(
        f"\nLSH insert+query, {n} docs, bands={bands} rows={rows} (threshold {params.threshold}), same candidates: yes"
    )
    print(f"  ours LshIndex          {n / t_ours:10.0f} docs/s")
    print(f"  datasketch MinHashLSH  {n / t_theirs:10.0f} docs/s")
    print(f"  ratio {t_theirs / t_ours:.1f}x (target >= 5x: {'OK' if t_theirs / t_ours >= 5 else 'MISSED'})")
    print("  index size: measured in a warehouse by bench_e2e.py (near index bytes per stored record)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=at_least_one, default=4000)
    parser.add_argument("--repeat", type=at_least_one, default=5)
    parser.add_argument("--pin", action="store_true", help="pin the process to one CPU")
    args = parser.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(
        f"numpy {np.__version__}, numba {numba.__version__}, xxhash {xxhash.VERSION}, single-threaded, CPUs allowed: "
        f"{sorted(os.sched_getaffinity(0))}, load average {os.getloadavg()[0]:.2f}"
    )
    docs = make_documents(args.docs)
    signatures = bench_signatures(docs, args.repeat)
    bench_lsh(signatures, args.repeat)


if __name__ == "__main__":
    main()
