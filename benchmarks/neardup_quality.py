"""Near-duplicate clustering quality on labelled public data, side by side.

    .venv/bin/python benchmarks/neardup_quality.py /work/shared/data [--sweep]

Methods, each turning a list of texts into clusters:

* ``ours-minhash``: ``cluster_near_duplicates(texts)`` with the defaults
  (``verify="auto"``: the estimate, and the exact Jaccard for the pairs whose
  estimate is too close to the threshold to decide).
* ``ours-minhash verify=exact``: the same candidates, verified by the exact
  Jaccard of the shingle sets instead of the estimate.
* ``ours-simhash``: ``cluster_near_duplicates(texts, method="simhash")``.
* ``datasketch``: ``MinHashLSH()`` at its defaults (threshold 0.9, 128
  permutations), ``MinHash()`` at its defaults (sha1, affine32) over the set
  of whitespace tokens of the text, as in datasketch's documentation; every
  document is queried and query results are linked (no verification).
* ``datasketch+ours-shingles``: the same index, fed with our shingles, to
  separate the index from the featurisation.
* ``simhash-pkg``: the ``simhash`` package at its defaults: ``Simhash(text)``
  (its own char 4-gram features, md5) and ``SimhashIndex(k=2)``, linking
  query results.

Links are closed transitively (union-find) for every method. Metrics are
pairwise precision/recall/F1 over all pairs of documents (a pair is
predicted positive when both land in one cluster) and the adjusted Rand
index. ``R@J>=t`` is the recall of ours-minhash on the pairs whose exact
Jaccard on our shingles is at least the configured threshold (ground truth
ignored): the share linked directly, and the share ending in one cluster.
``scipy.sparse`` (installed with datasketch) finds those pairs.

Ground truth per set (read each folder's README.md):

* ``pragmar``: HTML pages of one site saved by several crawlers
  (``clusters.tsv``); same URL = same page. Non-HTML resources (CSS, JS,
  SVG) from katana are left out. URLs with an empty path get "/", because
  katana wrote ``https://example.com`` where the others wrote
  ``https://example.com/``. Text is the visible HTML text (no script/style).
* ``cora``: citation strings (all fields but id and label joined); same
  ``label`` = same paper.
* ``cddb``: CD records as "artist title tracks"; the 300 gold pairs, closed
  transitively, are the clusters.
* ``clough``: for each task, the Wikipedia original and its ``cut`` and
  ``light`` copies form one cluster; ``heavy`` rewrites and ``non``
  answers are singletons (a heavy paraphrase is a rewrite, not a copy).
  ``clough+heavy`` also puts the heavy rewrites into their task's cluster.

``--sweep`` prints F1 of ours-minhash/simhash over shingle settings and
thresholds, which is how the defaults were chosen.
"""

from __future__ import annotations

import argparse
import csv
import html.parser
import re
import sys
import time
from math import comb
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dedup_pipeline.core.clustering import cluster_labels  # noqa: E402
from dedup_pipeline.core.minhash import minhash_signatures  # noqa: E402
from dedup_pipeline.core.near import (  # noqa: E402
    NearDupParams,
    cluster_near_duplicates,
    minhash_links,
    near_duplicate_links,
    shingle_texts,
    simhash_links,
)
from dedup_pipeline.core.text import TextNormaliser  # noqa: E402


# ---------------------------------------------------------------- data sets
class _VisibleText(html.parser.HTMLParser):
    """Visible text of an HTML page: everything outside script/style/etc."""

    SKIP = {"script", "style", "noscript", "template", "svg"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.depth += 1

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if not self.depth:
            self.parts.append(data)


def html_text(markup: str) -> str:
    parser = _VisibleText()
    parser.feed(markup)
    parser.close()
    return " ".join(" ".join(parser.parts).split())


def _katana_body(raw: str) -> str | None:
    """HTML body of a katana capture (URL, request, response), or None if not HTML."""
    response = raw.find("\nHTTP/1.")
    head_end = raw.find("\n\n", response)
    headers, body = raw[response:head_end], raw[head_end + 2 :]
    if "content-type: text/html" not in headers.lower():
        return None
    if "transfer-encoding: chunked" in headers.lower():
        body = re.sub(r"(?m)^[0-9a-fA-F]{1,8}\r?$", "", body)  # chunk-size lines
    return body


def _canonical_url(url: str) -> str:
    return url + "/" if re.fullmatch(r"https?://[^/]+", url) else url


def load_pragmar(root: Path):
    base = root / "crawl_pragmar_multicrawler"
    texts, labels = [], []
    with open(base / "clusters.tsv", encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            raw = (base / row["file"]).read_bytes().decode("utf-8", errors="replace")
            if row["crawler"] == "katana":
                raw = _katana_body(raw)
                if raw is None:
                    continue
            texts.append(html_text(raw))
            labels.append(_canonical_url(row["url"]))
    return texts, labels


def load_cora(root: Path):
    with open(root / "er_jedai" / "cora" / "cora.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    fields = [k for k in rows[0] if k not in ("id", "label")]
    texts = [" ".join(" ".join(r[k] for k in fields).split()) for r in rows]
    return texts, [r["label"] for r in rows]


def load_cddb(root: Path):
    base = root / "er_jedai" / "cddb"
    with open(base / "cddb.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    position = {r["id"]: p for p, r in enumerate(rows)}
    with open(base / "gt.csv", encoding="utf-8") as f:
        links = [(position[g["id1"]], position[g["id2"]]) for g in csv.DictReader(f)]
    texts = [" ".join(f"{r['artist']} {r['title']} {r['tracks']}".split()) for r in rows]
    return texts, cluster_labels(len(rows), links).tolist()


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace")


def load_clough(root: Path, heavy: bool = False):
    base = root / "neardup_clough_stevenson"
    with open(base / "file_information.csv", encoding="utf-8") as f:
        info = list(csv.DictReader(f))  # includes the five orig_task*.txt
    positive = {"orig", "cut", "light"} | ({"heavy"} if heavy else set())
    texts = [_read_text(base / row["File"]) for row in info]
    labels = [f"task{row['Task']}" if row["Category"] in positive else row["File"] for row in info]
    return texts, labels


DATASETS = {
    "pragmar": load_pragmar,
    "cora": load_cora,
    "cddb": load_cddb,
    "clough": load_clough,
    "clough+heavy": lambda root: load_clough(root, heavy=True),
}


# ------------------------------------------------------------------ metrics
def _contingency(truth, pred):
    _, t = np.unique(np.asarray(truth, dtype=object).astype(str), return_inverse=True)
    _, p = np.unique(np.asarray(pred), return_inverse=True)
    cells = np.unique(t.astype(np.int64) * (p.max() + 1) + p, return_counts=True)[1]
    return cells, np.bincount(t), np.bincount(p)


def pair_scores(truth, pred) -> dict[str, float]:
    """Pairwise precision, recall, F1 and the adjusted Rand index."""
    cells, true_sizes, pred_sizes = _contingency(truth, pred)
    pairs = lambda sizes: float(sum(comb(int(s), 2) for s in sizes))  # noqa: E731
    tp, true_pairs, pred_pairs, total = pairs(cells), pairs(true_sizes), pairs(pred_sizes), comb(len(truth), 2)
    precision = tp / pred_pairs if pred_pairs else 1.0
    recall = tp / true_pairs if true_pairs else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    expected = true_pairs * pred_pairs / total if total else 0.0
    maximum = (true_pairs + pred_pairs) / 2
    ari = (tp - expected) / (maximum - expected) if maximum != expected else 1.0
    return {"P": precision, "R": recall, "F1": f1, "ARI": ari}


def high_jaccard_pairs(shingles, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """All pairs with exact shingle-set Jaccard >= threshold (sparse products)."""
    from scipy import sparse  # installed with datasketch

    vocab: dict[bytes, int] = {}
    rows, cols = [], []
    for doc, items in enumerate(shingles):
        for s in set(items):
            rows.append(doc)
            cols.append(vocab.setdefault(s, len(vocab)))
    n = len(shingles)
    x = sparse.csr_matrix((np.ones(len(rows), dtype=np.int32), (rows, cols)), shape=(n, max(len(vocab), 1)))
    sizes = np.asarray(x.sum(axis=1)).ravel()
    found_i, found_j = [], []
    for start in range(0, n, 500):
        inter = (x[start : start + 500] @ x.T).tocoo()
        i, j, common = inter.row + start, inter.col, inter.data
        keep = (i < j) & (common >= threshold * (sizes[i] + sizes[j] - common))
        found_i.append(i[keep])
        found_j.append(j[keep])
    return np.concatenate(found_i), np.concatenate(found_j)


# ------------------------------------------------------------------ methods
def ours_minhash(texts):
    return cluster_near_duplicates(texts)


def ours_minhash_exact(texts):
    return cluster_near_duplicates(texts, verify="exact")


def ours_simhash(texts):
    return cluster_near_duplicates(texts, method="simhash")


def _datasketch_lsh(feature_sets):
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH()  # threshold=0.9, num_perm=128
    sketches = []
    for i, features in enumerate(feature_sets):
        m = MinHash()
        for f in features:
            m.update(f)
        lsh.insert(i, m)
        sketches.append(m)
    links = [(i, j) for i, m in enumerate(sketches) for j in lsh.query(m) if j != i]
    return cluster_labels(len(feature_sets), links).tolist()


def datasketch_default(texts):
    return _datasketch_lsh([{w.encode("utf-8") for w in text.split()} for text in texts])


def datasketch_our_shingles(texts):
    return _datasketch_lsh([set(s) for s in shingle_texts(texts, TextNormaliser())])


def simhash_package(texts):
    from simhash import Simhash, SimhashIndex

    # simhash 2.1.2 multiplies a uint8 bit array by the feature weight; under
    # numpy 2 a weight above 255 raises OverflowError (numpy 1 upcast it).
    # Restore the numpy 1 arithmetic; fingerprints are otherwise unchanged.
    Simhash._bitarray_from_bytes = staticmethod(lambda b: np.unpackbits(np.frombuffer(b, dtype=">B")).astype(np.int64))
    hashes = [Simhash(text) for text in texts]
    index = SimhashIndex([(str(i), h) for i, h in enumerate(hashes)])  # k=2
    links = [(i, int(j)) for i, h in enumerate(hashes) for j in index.get_near_dups(h) if int(j) != i]
    return cluster_labels(len(texts), links).tolist()


METHODS = {
    "ours-minhash": ours_minhash,
    "ours-minhash verify=exact": ours_minhash_exact,
    "ours-simhash": ours_simhash,
    "datasketch": datasketch_default,
    "datasketch+ours-shingles": datasketch_our_shingles,
    "simhash-pkg": simhash_package,
}
BASELINES = ("datasketch", "datasketch+ours-shingles", "simhash-pkg")


def recall_on_high_jaccard(texts, labels, params: NearDupParams) -> str:
    """How many pairs with exact Jaccard >= threshold were linked, and clustered together."""
    i, j = high_jaccard_pairs(shingle_texts(texts, params.normaliser), params.threshold)
    if not i.size:
        return "no pair reaches the threshold"
    linked = {(a, b) for a, b, _ in near_duplicate_links(texts, params)}
    direct = sum((a, b) in linked for a, b in zip(i.tolist(), j.tolist()))
    labels = np.asarray(labels)
    together = int(np.count_nonzero(labels[i] == labels[j]))
    return f"linked {direct / i.size:.3f}, same cluster {together / i.size:.3f} ({together}/{i.size} pairs)"


def report(root: Path) -> None:
    params = NearDupParams()
    print(f"ours-minhash: {params.identity()}")
    print(f"  threshold={params.threshold} verify={params.verify}")
    print(f"ours-simhash: {NearDupParams(method='simhash').identity()}")
    print(f"  simhash_max_distance={params.simhash_max_distance}")
    header = (
        f"{'set':13} {'docs':>5} {'true pairs':>10} {'method':26} {'P':>6} {'R':>6} {'F1':>6} {'ARI':>6} {'sec':>6}"
    )
    print(header)
    print("-" * len(header))
    verdicts = []
    for name, loader in DATASETS.items():
        texts, truth = loader(root)
        n_true = sum(comb(int(s), 2) for s in _contingency(truth, truth)[1])
        f1s = {}
        for method, run in METHODS.items():
            start = time.perf_counter()
            pred = run(texts)
            seconds = time.perf_counter() - start
            s = pair_scores(truth, pred)
            f1s[method] = s["F1"]
            print(
                f"{name:13} {len(texts):5d} {n_true:10d} {method:26} "
                f"{s['P']:6.3f} {s['R']:6.3f} {s['F1']:6.3f} {s['ARI']:6.3f} {seconds:6.2f}"
            )
            if method.startswith("ours-minhash"):
                p = params if method == "ours-minhash" else NearDupParams(verify="exact")
                print(f"{'':13} {'':5} {'':10}   R@J>={p.threshold}: {recall_on_high_jaccard(texts, pred, p)}")
        best_name = max(BASELINES, key=f1s.get)
        ours = f1s["ours-minhash"]
        verdicts.append(
            f"{name:13} ours-minhash F1 {ours:.3f} vs best baseline {f1s[best_name]:.3f} ({best_name}): "
            f"{'OK' if ours >= f1s[best_name] else 'MISSED'}"
        )
    print()
    print("\n".join(verdicts))


def sweep(root: Path) -> None:
    """F1 of ours over shingle settings and thresholds (used to pick defaults)."""
    settings = [("word", n) for n in (1, 2, 3, 4, 5)] + [("char", n) for n in (3, 4, 5, 6, 7)]
    thresholds = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    data = {name: loader(root) for name, loader in DATASETS.items()}
    print("minhash F1 (estimate verification), rows: shingles, columns: threshold")
    for name, (texts, truth) in data.items():
        print(f"\n{name}: " + " ".join(f"{t:>6}" for t in thresholds))
        for kind, n in settings:
            normaliser = TextNormaliser(shingle=kind, ngram=n)
            shingles = shingle_texts(texts, normaliser)
            sigs = minhash_signatures(shingles)
            row = []
            for t in thresholds:
                params = NearDupParams(threshold=t, normaliser=normaliser)
                links = minhash_links(sigs, params)
                row.append(pair_scores(truth, cluster_labels(len(texts), links).tolist())["F1"])
            print(f"  {kind}{n:<4} " + " ".join(f"{f:6.3f}" for f in row))
    print("\nsimhash F1, rows: shingles, columns: max distance")
    distances = (1, 2, 3, 4, 6, 8)
    for name, (texts, truth) in data.items():
        print(f"\n{name}: " + " ".join(f"{d:>6}" for d in distances))
        for kind, n in settings:
            normaliser = TextNormaliser(shingle=kind, ngram=n)
            shingles = shingle_texts(texts, normaliser)
            row = []
            for d in distances:
                params = NearDupParams(method="simhash", simhash_max_distance=d, normaliser=normaliser)
                links = simhash_links(shingles, params)
                row.append(pair_scores(truth, cluster_labels(len(texts), links).tolist())["F1"])
            print(f"  {kind}{n:<4} " + " ".join(f"{f:6.3f}" for f in row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--sweep", action="store_true", help="grid over shingles and thresholds")
    args = parser.parse_args()
    sweep(args.data_dir) if args.sweep else report(args.data_dir)


if __name__ == "__main__":
    main()
