"""The library on real text: non-ASCII signatures, and `cluster_near_duplicates` against rensa and datasketch.

    .venv/bin/python benchmarks/bench_cluster.py [--rounds 9] [--update-rounds 3] [--pin]

Three comparisons, each in one process, the sides taking turns round by round, CPU time of the process
(``time.process_time``, the garbage collector paused), medians over ``--rounds``; single-threaded (the BLAS/OpenMP
thread variables are 1, as in ``bench_minhash.py``; ``--pin`` also pins the process to one CPU). Every side
starts from the texts and the timed call ends with its result in hand; numba's kernels are compiled before.

1. Signatures on real, non-ASCII text: ``minhash_signatures_from_texts`` (what the near-duplicate rung runs)
   on the distinct paragraphs of the article benchmark (``../shared/data/html_article_benchmark``) that hold a
   non-ASCII character, against the same paragraphs mapped to ASCII by ``anyascii`` (curly quotes and dashes
   to their ASCII forms, accents dropped, Cyrillic transliterated), so both sides have about as many shingles.
   Target: non-ASCII at least 0.7x the ASCII rate.
2. ``cluster_near_duplicates(texts)`` (defaults: threshold 0.5, 128 permutations) on every distinct paragraph,
   against rensa's ``RMinHash`` + ``RMinHashLSH`` end to end: our normaliser's shingles
   (``TextNormaliser.shingle_bytes``, so both sides compare the same features), ``RMinHash.from_token_sets``,
   ``insert_pairs`` and ``query_all``, candidates verified by rensa's estimated Jaccard at the same threshold,
   then the same union-find (``cluster_labels``) as ours. rensa needs bands that divide ``num_perm``: 32 bands
   of 4 rows, the nearest to our 26 of 3 (a pair at Jaccard 0.5 becomes its candidate with probability 0.87,
   ours with 0.97, so rensa verifies fewer candidates). Target: ours at least 1.5x rensa. Printed beside it,
   not for the target: rensa on lower-cased whitespace words (no normalisation, other features), which spares
   it building our shingles as Python objects, most of its time on the same features.
3. A corpus dense in near-copies, built from the same paragraphs (those of 20 words or more): most get
   copies with words replaced, inserted and deleted (1 to 8 % of the words each). ``cluster_near_duplicates``
   against datasketch end to end with the same docs: the normaliser's shingles (as in ``bench_minhash.py``),
   ``MinHash.bulk`` or one ``MinHash.update`` per shingle (``hashfunc=xxhash.xxh32_intdigest``, the signatures
   bit-identical to ours), ``MinHashLSH`` at our bands and rows (so the candidates are ours), candidates verified
   by datasketch's estimated Jaccard, the same union-find. Targets: at least 3x ``bulk`` and 40x ``update``.
   ``update`` takes about 35 s a round, so it runs in the first ``--update-rounds`` rounds only.

For each comparison the script also prints how the two sides' clusters and linked pairs compare, and for the
dense corpus how many of the planted pairs (a paragraph and its copies) each side puts in one cluster.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from anyascii import anyascii  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_minhash import NUM_PERM, SEED, datasketch_bulk, datasketch_update  # noqa: E402
from benchmarks.common import alternating_cpu, article_paragraphs, at_least_one  # noqa: E402
from dedup_pipeline.core.clustering import cluster_labels  # noqa: E402
from dedup_pipeline.core.minhash import minhash_signatures_from_texts  # noqa: E402
from dedup_pipeline.core.near import NearDupParams, cluster_near_duplicates, near_duplicate_links  # noqa: E402

PARAMS = NearDupParams()
RENSA_BANDS = 32


def _verified_labels(n: int, sketches: dict, candidates, threshold: float) -> tuple[np.ndarray, list]:
    """Labels from a library's candidates: each pair once, kept when the library's estimate reaches the threshold."""
    links = []
    for i, found in candidates:
        mine = sketches[i]
        for j in found:
            if j > i and mine.jaccard(sketches[j]) >= threshold:
                links.append((i, j))
    return cluster_labels(n, links), links


def lower_words(text: str) -> list[str]:
    """The plain tokens a rensa user might give it: lower-cased words split at whitespace, punctuation kept."""
    return text.lower().split()


def rensa_clusters(texts: list[str], tokens=PARAMS.normaliser.shingle_bytes) -> tuple[np.ndarray, list]:
    from rensa import RMinHash, RMinHashLSH

    shingles = [tokens(t) for t in texts]
    usable = [i for i, s in enumerate(shingles) if s]  # an empty sketch would match every other empty one
    sketches = RMinHash.from_token_sets([shingles[i] for i in usable], NUM_PERM, SEED)
    lsh = RMinHashLSH(PARAMS.threshold, NUM_PERM, RENSA_BANDS)
    lsh.insert_pairs(list(zip(usable, sketches)))
    by_id = dict(zip(usable, sketches))
    return _verified_labels(len(texts), by_id, zip(usable, lsh.query_all(sketches)), PARAMS.threshold)


def datasketch_clusters(texts: list[str], sign) -> tuple[np.ndarray, list]:
    from datasketch import MinHashLSH

    shingles = [PARAMS.normaliser.shingle_bytes(t) for t in texts]
    usable = [i for i, s in enumerate(shingles) if s]
    sketches = dict(zip(usable, sign([shingles[i] for i in usable])))
    lsh = MinHashLSH(num_perm=NUM_PERM, params=(PARAMS.bands, PARAMS.rows))
    for i in usable:
        lsh.insert(i, sketches[i], check_duplication=False)
    return _verified_labels(len(texts), sketches, ((i, lsh.query(sketches[i])) for i in usable), PARAMS.threshold)


def ours_clusters(texts: list[str]) -> np.ndarray:
    return np.asarray(cluster_near_duplicates(texts, PARAMS.threshold, num_perm=NUM_PERM, seed=SEED))


# ------------------------------------------------------------------ comparing results


def _clusters(labels: np.ndarray) -> set[tuple[int, ...]]:
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels.tolist()):
        groups.setdefault(label, []).append(i)
    return {tuple(g) for g in groups.values() if len(g) > 1}


def _pairs(clusters) -> set[tuple[int, int]]:
    return {(a, b) for group in clusters for k, a in enumerate(group) for b in group[k + 1 :]}


def compare(name_a: str, labels_a, links_a: int, name_b: str, labels_b, links_b: int) -> None:
    ca, cb = _clusters(labels_a), _clusters(labels_b)
    pa, pb = _pairs(ca), _pairs(cb)
    in_a, in_b = sum(map(len, ca)), sum(map(len, cb))
    print(
        f"   clusters of 2+: {name_a} {len(ca)} ({in_a} docs, {links_a} links), {name_b} {len(cb)} ({in_b} docs, "
        f"{links_b} links); identical clusters {len(ca & cb)}"
    )
    print(
        f"   pairs in one cluster: {name_a} {len(pa)}, {name_b} {len(pb)}, both {len(pa & pb)}; "
        f"docs whose cluster differs: {int(np.count_nonzero(_membership(labels_a) != _membership(labels_b)))}"
    )


def _membership(labels: np.ndarray) -> np.ndarray:
    """The smallest member of each doc's cluster: equal for two labellings exactly where the doc's cluster is."""
    smallest: dict[int, int] = {}
    for i, label in enumerate(labels.tolist()):
        smallest.setdefault(label, i)
    return np.array([smallest[label] for label in labels.tolist()])


def exact_jaccard(a: str, b: str) -> float:
    sa, sb = set(PARAMS.normaliser.shingle_bytes(a)), set(PARAMS.normaliser.shingle_bytes(b))
    return len(sa & sb) / len(sa | sb) if sa | sb else 0.0


# ------------------------------------------------------------------ the corpora


def non_ascii_corpus(paragraphs: list[str]) -> tuple[list[str], list[str]]:
    real = [p for p in paragraphs if not p.isascii()]
    return real, [anyascii(p) for p in real]


def dense_corpus(paragraphs: list[str], seed: int = 24) -> tuple[list[str], list[int]]:
    """Paragraphs of 20+ words, 85 % of them with 1-8 edited copies; the texts shuffled, and each text's original."""
    rng = random.Random(seed)
    bases = [p for p in paragraphs if len(p.split()) >= 20]
    vocabulary = sorted({w for p in bases for w in p.split()})
    texts, origin = [], []
    for b, base in enumerate(bases):
        texts.append(base)
        origin.append(b)
        if rng.random() >= 0.85:
            continue
        words = base.split()
        for _ in range(rng.randint(1, 8)):
            copy = list(words)
            for _ in range(max(1, round(len(words) * rng.uniform(0.01, 0.08)))):
                at = rng.randrange(len(copy))
                action = rng.random()
                if action < 0.4:
                    copy[at] = rng.choice(vocabulary)
                elif action < 0.7:
                    copy.insert(at, rng.choice(vocabulary))
                elif len(copy) > 5:
                    del copy[at]
            texts.append(" ".join(copy))
            origin.append(b)
    order = list(range(len(texts)))
    rng.shuffle(order)
    return [texts[i] for i in order], [origin[i] for i in order]


# ------------------------------------------------------------------ the three comparisons


def _rate(times: list[float], count: int) -> float:
    return count / statistics.median(times)


def _verdict(ratio: float, target: float) -> str:
    return f"target >= {target}x: {'MET' if ratio >= target else 'MISSED'}"


def bench_signatures(paragraphs: list[str], rounds: int) -> float:
    real, ascii_ = non_ascii_corpus(paragraphs)
    normaliser = PARAMS.normaliser
    shingles_real = sum(len(normaliser.shingle_bytes(t)) for t in real)
    shingles_ascii = sum(len(normaliser.shingle_bytes(t)) for t in ascii_)
    typographic = sum(any(c in t for c in "‘’“”–—…") for t in real)
    cyrillic = sum(any("\u0400" <= c <= "\u04ff" for c in t) for t in real)
    print(
        f"\n1. signatures, {len(real)} real paragraphs holding non-ASCII ({typographic / len(real):.0%} a curly quote, "
        f"dash or ellipsis, {cyrillic / len(real):.0%} Cyrillic), mean {np.mean([len(t) for t in real]):.0f} chars; "
        f"shingles {shingles_real} real, {shingles_ascii} mapped to ASCII"
    )
    # One pass takes about 30 ms: a round times several, so that a tick of other work weighs less.
    times = alternating_cpu(
        {
            "non-ASCII": lambda: [minhash_signatures_from_texts(real, normaliser, NUM_PERM, SEED) for _ in range(5)],
            "ASCII": lambda: [minhash_signatures_from_texts(ascii_, normaliser, NUM_PERM, SEED) for _ in range(5)],
        },
        rounds,
    )
    rates = {name: _rate(t, 5 * len(real)) for name, t in times.items()}
    per_round = sorted(a / b for a, b in zip(times["ASCII"], times["non-ASCII"]))
    ratio = rates["non-ASCII"] / rates["ASCII"]
    print(f"   minhash_signatures_from_texts: non-ASCII {rates['non-ASCII']:,.0f} docs/s, ASCII {rates['ASCII']:,.0f}")
    print(
        f"   non-ASCII / ASCII: {ratio:.2f}x (rounds {per_round[0]:.2f}x to {per_round[-1]:.2f}x; "
        f"per shingle {ratio * shingles_ascii / shingles_real:.2f}x) {_verdict(ratio, 0.7)}"
    )
    return ratio


def bench_rensa(paragraphs: list[str], rounds: int) -> float:
    texts = paragraphs
    print(
        f"\n2. cluster_near_duplicates against rensa {_version('rensa')} RMinHash + RMinHashLSH "
        f"({RENSA_BANDS} bands x {NUM_PERM // RENSA_BANDS} rows; ours {PARAMS.bands} x {PARAMS.rows}), "
        f"{len(texts)} real paragraphs, threshold {PARAMS.threshold}, {NUM_PERM} permutations"
    )
    times = alternating_cpu(
        {
            "ours": lambda: ours_clusters(texts),
            "rensa": lambda: rensa_clusters(texts),
            "rensa, whitespace words": lambda: rensa_clusters(texts, lower_words),
        },
        rounds,
    )
    rates = {name: _rate(t, len(texts)) for name, t in times.items()}
    ratio = rates["ours"] / rates["rensa"]
    per_round = sorted(a / b for a, b in zip(times["rensa"], times["ours"]))
    print(f"   ours {rates['ours']:,.0f} docs/s, rensa {rates['rensa']:,.0f} docs/s")
    print(f"   ours / rensa: {ratio:.2f}x (rounds {per_round[0]:.2f}x to {per_round[-1]:.2f}x) {_verdict(ratio, 1.5)}")
    words_labels, words = rensa_clusters(texts, lower_words), rates["rensa, whitespace words"]
    print(
        f"   not the target's comparison: rensa on lower-cased whitespace words (other features) {words:,.0f} "
        f"docs/s, ours / that {rates['ours'] / words:.2f}x; {len(_clusters(words_labels[0]))} clusters of 2+"
    )
    ours = ours_clusters(texts)
    links = near_duplicate_links(texts, PARAMS)
    theirs, their_links = rensa_clusters(texts)
    compare("ours", ours, len(links), "rensa", theirs, len(their_links))
    only_theirs = _pairs(_clusters(theirs)) - _pairs(_clusters(ours))
    if only_theirs:
        below = sum(exact_jaccard(texts[a], texts[b]) < PARAMS.threshold for a, b in only_theirs)
        print(
            f"   of the pairs only rensa clusters, {below} of {len(only_theirs)} have an exact Jaccard "
            "below the threshold"
        )
    return ratio


def bench_datasketch(paragraphs: list[str], rounds: int, update_rounds: int) -> tuple[float, float]:
    import datasketch

    texts, origin = dense_corpus(paragraphs)
    sizes = Counter(origin)
    with_copies = sum(1 for o in origin if sizes[o] > 1)
    by_origin: dict[int, list[int]] = {}
    for i, o in enumerate(origin):
        by_origin.setdefault(o, []).append(i)
    planted = _pairs(tuple(g) for g in by_origin.values() if len(g) > 1)
    print(
        f"\n3. cluster_near_duplicates against datasketch {datasketch.__version__} MinHash + MinHashLSH, a corpus "
        f"dense in near-copies: {len(texts)} docs from {len(sizes)} paragraphs, {with_copies / len(texts):.0%} of "
        f"the docs with a planted copy, {len(planted)} planted pairs"
    )
    times = alternating_cpu(
        {
            "ours": lambda: ours_clusters(texts),
            "datasketch bulk": lambda: datasketch_clusters(texts, datasketch_bulk),
            "datasketch update": lambda: datasketch_clusters(texts, datasketch_update),
        },
        rounds,
        {"datasketch update": update_rounds},
    )
    rates = {name: _rate(t, len(texts)) for name, t in times.items()}
    print("   " + ", ".join(f"{name} {rate:,.0f} docs/s" for name, rate in rates.items()))
    ratios = {}
    for name, target in (("datasketch bulk", 3), ("datasketch update", 40)):
        ratios[name] = statistics.median(times[name]) / statistics.median(times["ours"][: len(times[name])])
        per_round = sorted(a / b for a, b in zip(times[name], times["ours"]))  # the rounds both ran
        print(
            f"   ours / {name}: {ratios[name]:.1f}x (rounds {per_round[0]:.1f}x to {per_round[-1]:.1f}x) "
            f"{_verdict(ratios[name], target)}"
        )
    ours = ours_clusters(texts)
    links = near_duplicate_links(texts, PARAMS)
    theirs, their_links = datasketch_clusters(texts, datasketch_bulk)
    compare("ours", ours, len(links), "datasketch", theirs, len(their_links))
    for name, labels in (("ours", ours), ("datasketch", theirs)):
        found = _pairs(_clusters(labels))
        print(
            f"   {name}: {len(found & planted) / len(planted):.3f} of the planted pairs in one cluster; "
            f"{len(found - planted)} pairs of different paragraphs in one"
        )
    return ratios["datasketch bulk"], ratios["datasketch update"]


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=at_least_one, default=9)
    parser.add_argument(
        "--update-rounds",
        type=at_least_one,
        default=3,
        help="rounds of datasketch's per-shingle update (about 35 s each)",
    )
    parser.add_argument("--pin", action="store_true", help="pin the process to one CPU")
    args = parser.parse_args()
    if args.update_rounds > args.rounds:
        parser.error("--update-rounds must be at most --rounds")
    if args.pin:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    paragraphs = article_paragraphs()
    minhash_signatures_from_texts(paragraphs[:300], PARAMS.normaliser, NUM_PERM, SEED)  # compile the kernels
    print(
        f"numpy {np.__version__}, CPUs allowed: {sorted(os.sched_getaffinity(0))}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.rounds} rounds"
    )
    results = [
        ("signatures non-ASCII / ASCII", bench_signatures(paragraphs, args.rounds), 0.7),
        ("ours / rensa, real paragraphs", bench_rensa(paragraphs, args.rounds), 1.5),
    ]
    bulk, update = bench_datasketch(paragraphs, args.rounds, args.update_rounds)
    results += [("ours / datasketch bulk, dense", bulk, 3.0), ("ours / datasketch update, dense", update, 40.0)]
    print(f"\nsummary (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    for name, ratio, target in results:
        print(f"  {name:34} {ratio:7.2f}x  {_verdict(ratio, target)}")


if __name__ == "__main__":
    main()
