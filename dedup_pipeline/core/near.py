"""Near-duplicate detection: the parameter set and the library entry points.

Pipeline for ``method="minhash"`` (the default)::

    texts -> TextNormaliser.shingle_bytes -> minhash_signatures
          -> band_keys (empty documents dropped) -> candidate pairs
          -> verify: similarity >= threshold (estimated Jaccard; the exact Jaccard of the
             shingles where the estimate is too close to call, or everywhere)
          -> links (i, j, similarity), less those whose texts name different codes
          -> union-find clusters

``method="simhash"`` replaces the signature, banding and verification by
SimHash fingerprints, pigeonhole block search and Hamming distance <=
``simhash_max_distance`` (similarity ``1 - distance / 64``).

:func:`verify_pairs` and :func:`keep_shared_codes` are reused by the
warehouse layer (`store.near_graph`): it finds candidate pairs from stored
band keys, then verifies them with the same code.
"""

from __future__ import annotations

import math
import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from numbers import Integral
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from dedup_pipeline.core.clustering import RULES, cluster_labels
from dedup_pipeline.core.lsh import KEY_SCHEME_32, band_keys, candidate_pairs, candidate_probability, choose_bands_rows
from dedup_pipeline.core.minhash import (
    HASH_NAME,
    SCHEME,
    SIGNATURE_BITS,
    empty_mask,
    estimated_jaccard_pairs,
    minhash_signatures_from_texts,
    to_lean_minhash,
)
from dedup_pipeline.core.records import TEXT_FIELDS
from dedup_pipeline.core.simhash import BITS, simhash_candidates, simhash_fingerprints
from dedup_pipeline.core.text import TextNormaliser

if TYPE_CHECKING:
    from datasketch import LeanMinHash

#: Version of how the pieces below are combined into an index identity.
NEARDUP_VERSION = "neardup/2"

#: Jaccard threshold, measured on the quality data (benchmarks/neardup_quality.py --sweep; docs/benchmarks.md,
#: "Near-duplicate quality"): at 0.5 the default shingles beat datasketch's MinHashLSH over word sets and SimHash at
#: the same threshold on most labelled sets, short records and long texts alike.
DEFAULT_THRESHOLD = 0.5
#: Links a warehouse record keeps (to its nearest earlier near duplicates), and the most candidates it meets.
DEFAULT_MAX_LINKS = 3
DEFAULT_MAX_CANDIDATES = 1000

#: Default features per method. MinHash: ``shingle="auto"`` (word unigrams and character 4-grams for texts of
#: fewer than 75 tokens, where one typo would remove 3 word 3-grams of 8; word 3-grams for longer ones, the best
#: F1 on the crawled pages at a sixth of the shingles of character n-grams), chosen on the dev parts of every
#: labelled set. The earlier default, word 3-grams for every text, is ``TextNormaliser(shingle="word", ngram=3,
#: marks="strip")``.
#: SimHash: character 4-grams, because a 64-bit fingerprint needs many features
#: per document to be stable (word 3-grams lost on the short-text sets).
DEFAULT_NORMALISERS = {
    "minhash": TextNormaliser(),
    "simhash": TextNormaliser(shingle="char", ngram=4),
}

#: Weights of false positives and false negatives when choosing bands/rows.
#: Recall-leaning: a missed candidate is lost for good, while a false
#: candidate only costs one vectorised signature comparison. At the default
#: threshold this gives 26 bands of 3 rows: pairs at Jaccard 0.5 become
#: candidates with probability 0.97 (0.55 with equal weights), and a
#: warehouse stores 26 band keys in each record's `near_index` row.
LSH_WEIGHTS = (0.05, 0.95)

METHODS = ("minhash", "simhash")
VERIFY_MODES = ("auto", "estimate", "exact")
#: ``verify="auto"`` checks the exact Jaccard of pairs whose estimate lies within this many standard errors
#: of the threshold (the estimate of J from k permutations has a standard error of sqrt(J(1-J)/k)).
UNSURE_STANDARD_ERRORS = 2.0

Link = tuple[int, int, float]

#: A code is a token of at least this many characters that mixes letters and digits.
CODE_MIN_CHARS = 3
#: A token: a run of letters and digits (`[^\W_]` is `str.isalnum`), with the hyphens, slashes and dots between
#: two of its letters or digits that join it into one code ("KDL-40V5100", "KDL40V5100").
_JOINED_TOKENS = re.compile(r"[^\W_]+(?:[-/.][^\W_]+)*")
_DROP_JOINERS = str.maketrans("", "", "-/.")
_DIGIT = re.compile(r"\d")
#: Texts whose codes `codes` remembers, the most recently used: a near rung reads the same link ends' texts chunk
#: after chunk (on a syndication-heavy crawl, 195,000 calls for 32,000 texts). Each is remembered by a 128-bit
#: digest, not the text, so its memory does not grow with the texts' length: about 9 MB for texts naming three
#: codes each.
CODES_CACHE = 16_384


@dataclass(frozen=True)
class NearDupParams:
    """Every setting of near-duplicate detection; immutable and hashable.

    ``bands``/``rows`` default to :func:`choose_bands_rows` for ``threshold``
    and ``num_perm``; given, they are kept whatever the threshold, so an index
    built for one threshold can be queried at another without a rebuild
    (``dataclasses.replace(params, threshold=t)`` keeps them too, and so does
    :meth:`with_threshold`): the identity leaves the threshold out.
    :meth:`threshold_warning` says when the threshold has gone too far below
    what the bands were built for. ``normaliser`` defaults to the method's entry in
    :data:`DEFAULT_NORMALISERS`. ``threshold`` is a Jaccard threshold and applies to
    ``method="minhash"``; ``method="simhash"`` links documents whose
    fingerprints differ in at most ``simhash_max_distance`` bits.
    ``require_shared_code`` keeps apart two texts that both name codes (:func:`codes`: model and part numbers)
    but none in common, whatever their similarity: "... Sleeve Pink iCC2010PNK" and "... Sleeve Black
    ICC2010BLK" are two products.
    """

    method: str = "minhash"
    threshold: float = DEFAULT_THRESHOLD
    num_perm: int = 128
    seed: int = 1
    scheme: str = SCHEME
    bands: int | None = None
    rows: int | None = None
    normaliser: TextNormaliser | None = None
    simhash_max_distance: int = 3
    verify: str = "auto"
    representative: str = "oldest"
    require_shared_code: bool = True

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
            bands, rows = chosen_bands_rows(self.threshold, self.num_perm)
            object.__setattr__(self, "bands", bands)
            object.__setattr__(self, "rows", rows)
        elif self.bands < 1 or self.rows < 1 or self.bands * self.rows > self.num_perm:
            raise ValueError("bands * rows must be in [1, num_perm]")

    def identity(self) -> str:
        """A stable string naming everything that determines the stored keys.

        An index (band keys or fingerprints) built under a different identity
        must be refused. The threshold, the verification mode and the
        representative rule are left out: they only act on query results.
        The warehouse index stores b-bit signatures and 32-bit band keys, and
        says so.
        """
        return self._identity(self.normaliser.identity())

    def identities(self) -> tuple[str, ...]:
        """:meth:`identity`, then the identities an index holding the same keys may carry from earlier versions.

        An index stored under any of these holds exactly the keys these params make (the earlier rule
        versions of :meth:`TextNormaliser.identities`): a warehouse may accept it instead of rebuilding.
        """
        return tuple(self._identity(text) for text in self.normaliser.identities())

    def _identity(self, text_identity: str) -> str:
        if self.method == "minhash":
            sketch = (
                f"method=minhash;scheme={self.scheme};hash={HASH_NAME};num_perm={self.num_perm};"
                f"seed={self.seed};bands={self.bands};rows={self.rows};keys={KEY_SCHEME_32};bits={SIGNATURE_BITS}"
            )
        else:
            sketch = f"method=simhash;hash=xxh64;bits={BITS};weights=tf;blocks={self.simhash_max_distance + 1}"
        return f"{NEARDUP_VERSION};{sketch};{text_identity}"

    def with_threshold(self, threshold: float) -> NearDupParams:
        """The same params (and index identity) at another threshold: ``bands``/``rows`` stay as they are."""
        return replace(self, threshold=threshold)

    def threshold_recall(self) -> float:
        """MinHash: :func:`threshold_recall` of ``threshold`` under ``bands``/``rows`` (1.0 for SimHash)."""
        return threshold_recall(self.threshold, self.bands, self.rows) if self.method == "minhash" else 1.0

    def threshold_warning(self, min_recall: float | None = None) -> str | None:
        """MinHash: :func:`threshold_warning` of ``threshold`` under ``bands``/``rows``; None for SimHash."""
        if self.method != "minhash":
            return None
        return threshold_warning(
            self.threshold,
            self.bands,
            self.rows,
            MIN_THRESHOLD_RECALL if min_recall is None else min_recall,
            num_perm=self.num_perm,
        )

    def as_dict(self) -> dict:
        """Every setting as plain JSON data (:meth:`from_dict` reads it back)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "normaliser"}
        return {**values, "normaliser": {f.name: getattr(self.normaliser, f.name) for f in fields(self.normaliser)}}

    @classmethod
    def from_dict(cls, data: Mapping) -> NearDupParams:
        values = dict(data)
        normaliser = values.pop("normaliser", None)
        return cls(**values, normaliser=TextNormaliser(**normaliser) if normaliser else None)


#: :func:`threshold_warning` warns when fewer pairs at the threshold than this become candidates.
MIN_THRESHOLD_RECALL = 0.9


def chosen_bands_rows(threshold: float, num_perm: int) -> tuple[int, int]:
    """The bands and rows an index is built with for `threshold` when none are given: :func:`choose_bands_rows` at
    :data:`LSH_WEIGHTS` (a threshold of 1 as 0.99, where datasketch chooses)."""
    return choose_bands_rows(min(threshold, 0.99), num_perm, *LSH_WEIGHTS)


def _rounded_up(threshold: float) -> float:
    """`threshold` rounded up to the 0.001 a message prints, so that the printed value is still at or above it."""
    return math.ceil(threshold * 1000) / 1000


def threshold_recall(threshold: float, bands: int, rows: int) -> float:
    """Probability that a pair whose Jaccard is exactly ``threshold`` becomes a candidate (shares a band).

    :func:`~dedup_pipeline.core.lsh.candidate_probability` at the threshold: pairs above it fare better, so
    this is the worst recall banding allows among the pairs verification would keep.
    """
    _check_banding(bands, rows, threshold)
    return candidate_probability(threshold, bands, rows)


def _check_banding(bands: int, rows: int, threshold: float | None = None) -> None:
    """ValueError for bands or rows under 1, or a threshold outside (0, 1] (the formulas would answer anyway)."""
    if not (isinstance(bands, Integral) and isinstance(rows, Integral) and bands >= 1 and rows >= 1):
        raise ValueError(f"bands and rows must be whole numbers of at least 1, got {bands!r} and {rows!r}")
    if threshold is not None and not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")


def lowest_threshold(bands: int, rows: int, min_recall: float = MIN_THRESHOLD_RECALL) -> float:
    """The least threshold at which banding still makes candidates of ``min_recall`` of the pairs at it.

    Solves ``1 - (1 - s**rows)**bands = min_recall`` for ``s``.
    """
    if not 0.0 < min_recall < 1.0:
        raise ValueError("min_recall must be in (0, 1)")
    _check_banding(bands, rows)
    return float((1.0 - (1.0 - min_recall) ** (1.0 / bands)) ** (1.0 / rows))


def threshold_warning(
    threshold: float,
    bands: int,
    rows: int,
    min_recall: float = MIN_THRESHOLD_RECALL,
    num_perm: int = NearDupParams.num_perm,
) -> str | None:
    """A warning when ``threshold`` is too far below what ``bands``/``rows`` were built for, else None.

    Far means: a pair at exactly the threshold becomes a candidate with probability below ``min_recall``,
    so verification never sees many of the pairs it would keep. A threshold above the one the bands were
    built for loses nothing (it only verifies more candidates than it needs) and gets no warning. The advice
    is one that works: the least threshold these bands serve (rounded up, so it does not warn itself), and
    an index of ``num_perm`` permutations that serves ``threshold`` (see :func:`serving_bands_rows`).
    """
    recall = threshold_recall(threshold, bands, rows)
    if recall >= min_recall:
        return None
    floor = _rounded_up(lowest_threshold(bands, rows, min_recall))  # rounded up: it serves
    head = (
        f"threshold {threshold:g} is too low for an index of {bands} bands of {rows} rows: a pair at Jaccard "
        f"{threshold:g} becomes a candidate with probability {math.floor(recall * 1000) / 1000:.3f} "
        f"(< {min_recall:g}); use a threshold of at least {floor:.3f}"
    )
    serving = serving_bands_rows(threshold, num_perm, min_recall)
    if serving is None:
        widest = _rounded_up(lowest_threshold(num_perm, 1, min_recall))
        return (
            f"{head}. No index of {num_perm} permutations serves {threshold:g} (the lowest any serves is "
            f"{widest:.3f}, with {num_perm} bands of 1 row): for a lower threshold, build one with more (num_perm)"
        )
    if serving == chosen_bands_rows(threshold, num_perm):
        config, library = (
            f'{{"threshold": {threshold:g}}}',
            f"NearDupParams(threshold={threshold:g}) without bands and rows",
        )
    else:  # the bands chosen for the threshold do not serve it (a threshold near 1): pin ones that do
        config = f'{{"threshold": {threshold:g}, "bands": {serving[0]}, "rows": {serving[1]}}}'
        library = f"NearDupParams(threshold={threshold:g}, bands={serving[0]}, rows={serving[1]})"
    return (
        f"{head}, or build the index for {threshold:g} (a warehouse: dedup-pipeline rebuild-near-index --config "
        f"'{config}'; the library: {library})"
    )


def serving_bands_rows(
    threshold: float, num_perm: int, min_recall: float = MIN_THRESHOLD_RECALL
) -> tuple[int, int] | None:
    """The bands and rows of ``num_perm`` permutations for an index serving ``threshold``; None if none can.

    The bands :func:`choose_bands_rows` picks for the threshold when they make candidates of ``min_recall``
    of the pairs at it; else (a threshold near 1, where they favour precision) the banding with the most rows
    (the fewest needless candidates) that does, with the fewest bands (the smallest index) for those rows.
    """
    _check_banding(1, 1, threshold)
    chosen = chosen_bands_rows(threshold, num_perm)
    if threshold_recall(threshold, *chosen) >= min_recall:
        return chosen
    for rows in range(num_perm, 0, -1):
        for bands in range(1, num_perm // rows + 1):
            if candidate_probability(threshold, bands, rows) >= min_recall:
                return bands, rows
    return None


def near_text(payload: Mapping) -> str:
    """The text of a record compared for near duplicates: its title and description."""
    return " ".join(str(payload[f]) for f in TEXT_FIELDS if payload.get(f))


def codes(text: str) -> frozenset[str]:
    """The codes a text names: its tokens of at least :data:`CODE_MIN_CHARS` characters that mix letters and
    digits (model, part and catalogue numbers, SKUs), after NFKC and case folding, with the hyphens, slashes and
    dots inside them dropped. Words and plain numbers (years, prices, ids) are not codes; a digit is a decimal
    digit of any script. A text without one names no code: superscripts alone (mojibake's "Â³") make none,
    though NFKC makes them digits in a text that has some."""
    if not _DIGIT.search(text):
        return frozenset()
    key = xxhash.xxh3_128_digest(text.encode("utf-8", "surrogatepass"))
    with _CODES_LOCK:
        found = _CODES_SEEN.get(key)
        if found is not None:
            _CODES_SEEN.move_to_end(key)
            return found
    found = _codes_of(text)
    with _CODES_LOCK:
        _CODES_SEEN[key] = found
        if len(_CODES_SEEN) > CODES_CACHE:
            _CODES_SEEN.popitem(last=False)
    return found


_CODES_SEEN: OrderedDict[bytes, frozenset[str]] = OrderedDict()
_CODES_LOCK = threading.Lock()


def _codes_of(text: str) -> frozenset[str]:
    """`codes` of a text holding a decimal digit, worked out."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    found = set()
    end = 0
    for digit in _DIGIT.finditer(folded):  # only the tokens around a digit are looked at: most tokens are words
        if digit.start() < end:
            continue  # in the token just taken
        token = _JOINED_TOKENS.match(folded, _token_start(folded, digit.start()))
        end = token.end()
        code = token.group().translate(_DROP_JOINERS)
        if len(code) >= CODE_MIN_CHARS and not code.isdecimal():
            found.add(code)
    return frozenset(found)


def _token_start(text: str, i: int) -> int:
    """Where the token holding `text[i]` starts: back over letters and digits, and joiners between two of them."""
    while i > 0:
        if text[i - 1].isalnum():
            i -= 1
        elif text[i - 1] in "-/." and i > 1 and text[i - 2].isalnum():
            i -= 2
        else:
            break
    return i


def keep_shared_codes(
    links: list[Link], params: NearDupParams, texts: Callable[[list[int]], Mapping[int, str]]
) -> list[Link]:
    """``links`` less the pairs whose two texts both name codes but none in common, under
    ``params.require_shared_code``; ``texts`` gives the texts of the ends asked for."""
    if not params.require_shared_code or not links:
        return links
    by_end = {i: codes(text) for i, text in texts(sorted({i for i, _, _ in links} | {j for _, j, _ in links})).items()}
    empty: frozenset[str] = frozenset()
    return [
        link
        for link in links
        if not (a := by_end.get(link[0], empty)) or not (b := by_end.get(link[1], empty)) or not a.isdisjoint(b)
    ]


def shingle_texts(texts: Sequence[str], normaliser: TextNormaliser) -> list[list[bytes]]:
    """UTF-8 shingles of each text under ``normaliser``."""
    return [normaliser.shingle_bytes(text) for text in texts]


def verify_pairs(
    signatures: np.ndarray,
    left: np.ndarray,
    right: np.ndarray,
    params: NearDupParams,
    shingles: Sequence[Sequence[bytes]] | Callable[[np.ndarray], Mapping[int, Sequence[bytes]]] | None = None,
    estimates: np.ndarray | None = None,
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
    ``estimates`` replaces the estimated Jaccard of ``signatures`` (the
    warehouse passes those of its b-bit signatures, :func:`~dedup_pipeline.core.minhash.bbit_jaccard_pairs`).
    """
    left = np.asarray(left, dtype=np.int64)
    right = np.asarray(right, dtype=np.int64)
    if params.verify == "exact":
        sims = _exact_jaccard(left, right, _shingles_of(shingles, left, right))
    else:
        sims = (
            estimated_jaccard_pairs(signatures, left, right) if estimates is None else np.array(estimates, dtype=float)
        )
        if params.verify == "auto":
            t = params.threshold
            unsure = np.flatnonzero(np.abs(sims - t) < UNSURE_STANDARD_ERRORS * np.sqrt(t * (1 - t) / params.num_perm))
            if unsure.size:
                lo, hi = left[unsure], right[unsure]
                sims[unsure] = _exact_jaccard(lo, hi, _shingles_of(shingles, lo, hi))
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
    shingles: Sequence[Sequence[bytes]] | Callable[[np.ndarray], Mapping[int, Sequence[bytes]]] | None = None,
) -> list[Link]:
    """Verified links among the rows of ``signatures`` (an in-batch self-join); ``shingles`` as :func:`verify_pairs`."""
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


def as_texts(texts: Iterable[str]) -> list[str]:
    """`texts` as a list of strings, positions 0..n-1 (a pandas Series by position, not by its index labels); a
    TypeError naming the first item that is not a string, or saying that one string was given for many."""
    if isinstance(texts, str | bytes):
        raise TypeError("texts is one string: give a sequence of texts (a list, a pandas Series...)")
    texts = list(texts)
    for position, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts must be strings: item {position} is {type(text).__name__} ({text!r:.40})")
    return texts


def near_duplicate_links(texts: Sequence[str], params: NearDupParams | None = None) -> list[Link]:
    """Verified near-duplicate links ``(i, j, similarity)``, ``i < j``, sorted; `texts` any sequence of strings
    (:func:`as_texts`)."""
    return _links(as_texts(texts), params or NearDupParams())


def _links(texts: list[str], params: NearDupParams) -> list[Link]:
    """:func:`near_duplicate_links` of texts :func:`as_texts` has checked."""
    if params.method == "simhash":
        links = simhash_links(shingle_texts(texts, params.normaliser), params)
    else:
        signatures = minhash_signatures_from_texts(texts, params.normaliser, params.num_perm, params.seed)
        # Shingle objects only for the texts of the pairs that need the exact Jaccard (none under verify="estimate").
        links = minhash_links(
            signatures, params, lambda rows: {i: params.normaliser.shingle_bytes(texts[i]) for i in rows.tolist()}
        )
    return keep_shared_codes(links, params, lambda ends: {i: texts[i] for i in ends})


def to_lean_minhashes(texts: Sequence[str], params: NearDupParams | None = None) -> list[LeanMinHash]:
    """A ``datasketch.LeanMinHash`` per text under ``params`` (MinHash), for datasketch's own indexes.

    The signatures are those the near-duplicate rung computes (:func:`minhash_signatures_from_texts`):
    equal to ``datasketch.MinHash(num_perm, seed=seed, scheme="affine32", hashfunc=xxhash.xxh32_intdigest)``
    updated with ``params.normaliser.shingle_bytes(text)``, so they can go into ``MinHashLSH``,
    ``MinHashLSHForest`` or ``MinHashLSHEnsemble`` beside sketches datasketch made itself. An empty text gives
    datasketch's empty sketch.
    """
    texts = as_texts(texts)
    params = params or NearDupParams()
    if params.method != "minhash":
        raise ValueError("LeanMinHash sketches need method='minhash'")
    signatures = minhash_signatures_from_texts(texts, params.normaliser, params.num_perm, params.seed)
    return [to_lean_minhash(signature, params.seed) for signature in signatures]


#: The settings that make an index's keys (:meth:`NearDupParams.identity`), named as the `near_dup` resource names
#: them; the threshold, verification and representative rule are not among them.
SKETCH_SETTINGS = ("method", "num_perm", "shingle", "ngram", "marks", "bands", "rows", "simhash_max_distance")
#: The text settings among them (`TextNormaliser` fields); an index built before ``marks`` was one is ``"strip"``.
TEXT_SETTINGS = ("shingle", "ngram", "marks")


#: The sketch settings only one method reads (the others, such as the normaliser's, apply to both).
METHOD_ONLY_SETTINGS_OF = {"minhash": ("num_perm", "bands", "rows"), "simhash": ("simhash_max_distance",)}
METHOD_ONLY_SETTINGS = tuple(name for names in METHOD_ONLY_SETTINGS_OF.values() for name in names)


def sketch_config(params: NearDupParams) -> dict:
    """The sketch settings of `params` (those of :data:`SKETCH_SETTINGS` its method uses), as plain values."""
    text = {name: getattr(params.normaliser, name) for name in TEXT_SETTINGS}
    if params.method == "simhash":
        return {"method": "simhash", **text, "simhash_max_distance": params.simhash_max_distance}
    return {"method": "minhash", "num_perm": params.num_perm, **text, "bands": params.bands, "rows": params.rows}


def with_sketch_config(params: NearDupParams, config: Mapping) -> NearDupParams:
    """`params` with the sketch settings `config` gives (a part of a :func:`sketch_config`), the rest as they are.

    Another method starts from that method's default normaliser, as :func:`make_params` does.
    """
    method = config.get("method", params.method)
    normaliser = params.normaliser if method == params.method else DEFAULT_NORMALISERS[method]
    text = {name: config[name] for name in TEXT_SETTINGS if name in config}
    numbers = {name: config[name] for name in METHOD_ONLY_SETTINGS if name in config}
    return replace(params, method=method, normaliser=replace(normaliser, **text), **numbers)


def make_params(threshold: float = DEFAULT_THRESHOLD, method: str | None = "minhash", **options) -> NearDupParams:
    """:class:`NearDupParams` from keyword options.

    Options naming a :class:`TextNormaliser` field (``ngram``, ``shingle``,
    ``digits``...) change the method's default normaliser, unless
    ``normaliser`` is given. A setting only the other method reads is a ValueError; ``method=None`` (not
    known yet: a warehouse run takes its index's) builds MinHash params and leaves that to the index.
    """
    known = method is not None
    method = method or NearDupParams.method
    param_names = {f.name for f in fields(NearDupParams)}
    text_names = {f.name for f in fields(TextNormaliser)}
    text_options = {k: options.pop(k) for k in list(options) if k in text_names}
    unknown = set(options) - param_names
    if unknown:
        raise TypeError(f"unknown option(s): {sorted(unknown)}")
    own = METHOD_ONLY_SETTINGS_OF.get(method, METHOD_ONLY_SETTINGS)  # an unknown method is refused below
    foreign = sorted(name for name in options if name in METHOD_ONLY_SETTINGS and name not in own)
    if known and foreign:  # it would be accepted and have no effect
        owner = "SimHash" if method == "minhash" else "MinHash"
        raise ValueError(f"{', '.join(foreign)}: {owner} setting(s), which method={method!r} does not use")
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
    (``ngram``, ``shingle``...). Empty texts are always singletons. `texts` is any sequence of strings
    (:func:`as_texts`); labels are positions.
    """
    params = make_params(threshold, method, **options)
    texts = as_texts(texts)
    links = _links(texts, params)
    lengths = [len(text) for text in texts] if params.representative == "longest" else None
    return cluster_labels(len(texts), links, params.representative, lengths).tolist()
