"""Near-duplicate detection: the parameter set and the library entry points.

Pipeline for ``method="minhash"`` (the default)::

    texts -> TextNormaliser.shingle_bytes -> minhash_signatures
          -> band_keys (empty documents dropped) -> candidate pairs
          -> verify: similarity >= threshold (estimated Jaccard; the exact Jaccard of the
             shingles where the estimate is too close to call, or everywhere)
          -> links (i, j, similarity) -> union-find clusters

``method="simhash"`` replaces the signature, banding and verification by
SimHash fingerprints, pigeonhole block search and Hamming distance <=
``simhash_max_distance`` (similarity ``1 - distance / 64``).

:func:`near_duplicate_links` and :func:`verify_pairs` are the reusable
pieces for the warehouse layer: it finds candidate pairs from stored band
keys, then verifies them with the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from dedup_pipeline.core.clustering import DEFAULT_RULE, RULES, cluster_labels
from dedup_pipeline.core.lsh import KEY_SCHEME, band_keys, candidate_pairs, choose_bands_rows
from dedup_pipeline.core.minhash import (
    DEFAULT_NUM_PERM,
    DEFAULT_SEED,
    HASH_NAME,
    SCHEME,
    empty_mask,
    estimated_jaccard_pairs,
    minhash_signatures,
)
from dedup_pipeline.core.simhash import BITS, simhash_candidates, simhash_fingerprints
from dedup_pipeline.core.text import TextNormaliser

#: Version of how the pieces below are combined into an index identity.
NEARDUP_VERSION = "neardup/1"

#: Jaccard threshold on word 3-gram shingles, measured on the quality data
#: (benchmarks/neardup_quality.py --sweep): 0.5 keeps F1 near the best on the
#: crawled pages (0.98) while the short-record sets still work (cora 0.82,
#: cddb 0.68); higher thresholds lose cora, lower ones merge distinct pages.
DEFAULT_THRESHOLD = 0.5

#: Default features per method. MinHash: word 3-grams (best F1 on the crawled
#: pages, and about 6x fewer shingles per document than character n-grams).
#: SimHash: character 4-grams, because a 64-bit fingerprint needs many features
#: per document to be stable (word 3-grams lost on the short-text sets).
DEFAULT_NORMALISERS = {
    "minhash": TextNormaliser(shingle="word", ngram=3),
    "simhash": TextNormaliser(shingle="char", ngram=4),
}

#: Weights of false positives and false negatives when choosing bands/rows.
#: Recall-leaning: a missed candidate is lost for good, while a false
#: candidate only costs one vectorised signature comparison. At the default
#: threshold this gives 26 bands of 3 rows: pairs at Jaccard 0.5 become
#: candidates with probability 0.97 (0.55 with equal weights), and a
#: warehouse stores 26 key rows per document.
LSH_WEIGHTS = (0.05, 0.95)

METHODS = ("minhash", "simhash")
VERIFY_MODES = ("auto", "estimate", "exact")
#: ``verify="auto"`` checks the exact Jaccard of pairs whose estimate lies within this many standard errors
#: of the threshold (the estimate of J from k permutations has a standard error of sqrt(J(1-J)/k)).
UNSURE_STANDARD_ERRORS = 2.0

Link = tuple[int, int, float]


@dataclass(frozen=True)
class NearDupParams:
    """Every setting of near-duplicate detection; immutable and hashable.

    ``bands``/``rows`` default to :func:`choose_bands_rows` for ``threshold``
    and ``num_perm``; ``normaliser`` defaults to the method's entry in
    :data:`DEFAULT_NORMALISERS`. ``threshold`` is a Jaccard threshold and applies to
    ``method="minhash"``; ``method="simhash"`` links documents whose
    fingerprints differ in at most ``simhash_max_distance`` bits.
    """

    method: str = "minhash"
    threshold: float = DEFAULT_THRESHOLD
    num_perm: int = DEFAULT_NUM_PERM
    seed: int = DEFAULT_SEED
    scheme: str = SCHEME
    bands: int | None = None
    rows: int | None = None
    normaliser: TextNormaliser | None = None
    simhash_max_distance: int = 3
    verify: str = "auto"
    representative: str = DEFAULT_RULE

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.scheme != SCHEME:
            raise ValueError(f"only the {SCHEME!r} MinHash scheme is implemented, got {self.scheme!r}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError("threshold must be in (0, 1]")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {self.verify!r}")
        if self.representative not in RULES:
            raise ValueError(f"representative must be one of {RULES}, got {self.representative!r}")
        if not 0 <= self.simhash_max_distance < BITS:
            raise ValueError("simhash_max_distance must be in [0, 63]")
        if self.normaliser is None:
            object.__setattr__(self, "normaliser", DEFAULT_NORMALISERS[self.method])
        if (self.bands is None) != (self.rows is None):
            raise ValueError("give both bands and rows, or neither")
        if self.bands is None:
            bands, rows = choose_bands_rows(min(self.threshold, 0.99), self.num_perm, *LSH_WEIGHTS)
            object.__setattr__(self, "bands", bands)
            object.__setattr__(self, "rows", rows)
        elif self.bands < 1 or self.rows < 1 or self.bands * self.rows > self.num_perm:
            raise ValueError("bands * rows must be in [1, num_perm]")

    def identity(self) -> str:
        """A stable string naming everything that determines the stored keys.

        An index (band keys or fingerprints) built under a different identity
        must be refused. The threshold, the verification mode and the
        representative rule are left out: they only act on query results.
        """
        if self.method == "minhash":
            sketch = (
                f"method=minhash;scheme={self.scheme};hash={HASH_NAME};num_perm={self.num_perm};"
                f"seed={self.seed};bands={self.bands};rows={self.rows};keys={KEY_SCHEME}"
            )
        else:
            sketch = f"method=simhash;hash=xxh64;bits={BITS};weights=tf;blocks={self.simhash_max_distance + 1}"
        return f"{NEARDUP_VERSION};{sketch};{self.normaliser.identity()}"


def shingle_texts(texts: Sequence[str], normaliser: TextNormaliser) -> list[list[bytes]]:
    """UTF-8 shingles of each text under ``normaliser``."""
    return [normaliser.shingle_bytes(text) for text in texts]


def verify_pairs(
    signatures: np.ndarray,
    left: np.ndarray,
    right: np.ndarray,
    params: NearDupParams,
    shingles: Sequence[Sequence[bytes]] | Callable[[np.ndarray], Mapping[int, Sequence[bytes]]] | None = None,
) -> list[Link]:
    """Keep the candidate pairs whose similarity reaches ``params.threshold``.

    ``params.verify`` says which similarity: ``"estimate"``, the estimated
    Jaccard of the signatures; ``"exact"``, the Jaccard of the shingle sets;
    ``"auto"`` (the default), the estimate, except for the pairs whose
    estimate is too close to the threshold to decide (within
    :data:`UNSURE_STANDARD_ERRORS` standard errors), which get the exact
    Jaccard. ``shingles`` (needed unless ``"estimate"``) is indexed by row,
    or is a function from the rows needed to their shingles, so a caller can
    load only those. Pairs involving an empty document never pass.
    """
    left = np.asarray(left, dtype=np.int64)
    right = np.asarray(right, dtype=np.int64)
    if params.verify == "exact":
        sims = _exact_jaccard(left, right, _shingles_of(shingles, left, right))
    else:
        sims = estimated_jaccard_pairs(signatures, left, right)
        if params.verify == "auto":
            t = params.threshold
            unsure = np.flatnonzero(np.abs(sims - t) < UNSURE_STANDARD_ERRORS * np.sqrt(t * (1 - t) / params.num_perm))
            if unsure.size:
                lhs, rhs = left[unsure], right[unsure]
                sims[unsure] = _exact_jaccard(lhs, rhs, _shingles_of(shingles, lhs, rhs))
    keep = sims >= params.threshold
    return list(zip(left[keep].tolist(), right[keep].tolist(), sims[keep].tolist()))


def _shingles_of(
    shingles, left: np.ndarray, right: np.ndarray
) -> Mapping[int, Sequence[bytes]] | Sequence[Sequence[bytes]]:
    if shingles is None:
        raise ValueError("exact verification needs the shingles")
    if callable(shingles):
        return shingles(np.union1d(left, right))
    return shingles


def _exact_jaccard(left: np.ndarray, right: np.ndarray, shingles) -> np.ndarray:
    """Jaccard of the shingle sets of each pair (0.0 when both are empty)."""
    sets: dict[int, set] = {}
    sims = np.empty(left.size, dtype=np.float64)
    for p, (i, j) in enumerate(zip(left.tolist(), right.tolist())):
        a = sets.setdefault(i, set(shingles[i]))
        b = sets.setdefault(j, set(shingles[j]))
        union = len(a | b)
        sims[p] = len(a & b) / union if union else 0.0
    return sims


def minhash_links(
    signatures: np.ndarray,
    params: NearDupParams,
    shingles: Sequence[Sequence[bytes]] | None = None,
) -> list[Link]:
    """Verified links among the rows of ``signatures`` (an in-batch self-join)."""
    usable = np.flatnonzero(~empty_mask(signatures)) if len(signatures) else np.empty(0, dtype=np.int64)
    keys = band_keys(signatures[usable], params.bands, params.rows)
    pairs = usable[candidate_pairs(keys)]
    return verify_pairs(signatures, pairs[:, 0], pairs[:, 1], params, shingles)


def simhash_links(shingles: Sequence[Sequence[bytes]], params: NearDupParams) -> list[Link]:
    """Links between documents whose SimHash fingerprints are close enough."""
    usable = np.flatnonzero(np.fromiter(map(len, shingles), dtype=np.int64, count=len(shingles)))
    fingerprints = simhash_fingerprints([shingles[i] for i in usable])
    i, j, distance = simhash_candidates(fingerprints, params.simhash_max_distance)
    sims = 1.0 - distance / BITS
    return list(zip(usable[i].tolist(), usable[j].tolist(), sims.tolist()))


def near_duplicate_links(texts: Sequence[str], params: NearDupParams | None = None) -> list[Link]:
    """Verified near-duplicate links ``(i, j, similarity)``, ``i < j``, sorted."""
    params = params or NearDupParams()
    shingles = shingle_texts(texts, params.normaliser)
    if params.method == "simhash":
        return simhash_links(shingles, params)
    signatures = minhash_signatures(shingles, params.num_perm, params.seed)
    return minhash_links(signatures, params, shingles)


def make_params(threshold: float = DEFAULT_THRESHOLD, method: str = "minhash", **options) -> NearDupParams:
    """:class:`NearDupParams` from keyword options.

    Options naming a :class:`TextNormaliser` field (``ngram``, ``shingle``,
    ``digits``...) change the method's default normaliser, unless
    ``normaliser`` is given.
    """
    param_names = {f.name for f in fields(NearDupParams)}
    text_names = {f.name for f in fields(TextNormaliser)}
    text_options = {k: options.pop(k) for k in list(options) if k in text_names}
    unknown = set(options) - param_names
    if unknown:
        raise TypeError(f"unknown option(s): {sorted(unknown)}")
    if text_options:
        if "normaliser" in options:
            raise TypeError("give either normaliser or normaliser fields, not both")
        options["normaliser"] = replace(DEFAULT_NORMALISERS.get(method, TextNormaliser()), **text_options)
    return NearDupParams(method=method, threshold=threshold, **options)


def cluster_near_duplicates(
    texts: Sequence[str],
    threshold: float = DEFAULT_THRESHOLD,
    method: str = "minhash",
    **options,
) -> list[int]:
    """A cluster label per text: the index of its cluster's representative.

    Deterministic for a given input. ``options`` are :class:`NearDupParams`
    fields (``num_perm``, ``verify="exact"``, ``representative="longest"``,
    ``simhash_max_distance``...) or :class:`TextNormaliser` fields
    (``ngram``, ``shingle``...). Empty texts are always singletons.
    """
    params = make_params(threshold, method, **options)
    links = near_duplicate_links(texts, params)
    lengths = [len(text) for text in texts] if params.representative == "longest" else None
    return cluster_labels(len(texts), links, params.representative, lengths).tolist()
