"""Canonical fields and content hashes of a whole chunk of records at once, column by column.

The per-record functions (`canonical_fields`, the rules in `hashing`) are the
specification. `hash_records` gives exactly their payloads, digests and errors
for a list of records, with far less Python work per record:

- records are taken in blocks of `BLOCK` (so a block stays in the CPU cache
  across the passes over its columns) and grouped by their field names; each
  field of a group becomes a column, read row by row in one `itemgetter` pass;
- a text column is checked in a few scans of its values joined together: when
  it is printable ASCII with no space run and no value starting or ending with
  a space, `normalise_text` would leave every value as it is, and the column
  is used as it is. Otherwise the column, joined by NUL, is normalised in one
  go: NFC when it is not ASCII (NUL is a starter that composes with nothing,
  so NFC never reaches across it), whitespace collapsed by one split/join (NUL
  is not whitespace), then split back into values;
- the JSON text of every record of a group is written by one `str.join` over
  the columns interleaved with the field names (sorted, as `sort_keys` does),
  encoded once and split into one byte string per record, so only SHA-256
  runs once per record. JSON's own string encoder escapes the columns that
  need it; floats are formatted column-wise with ``%.4f``, which is what
  ``format(x, ".4f")`` gives;
- `content/1` and `content/2` are both computed from the same canonical columns.

A value the column code does not handle (nested values, mixed types in a
column, a Decimal or float that is not finite, NUL in text, a lone surrogate,
an unusual price, ...) goes through the per-record functions: value by value
when they cannot fail, else the whole record goes through `canonical_fields`
and `compute_hashes`. Unusual records therefore get exactly the result, or the
error, of the per-record path; the tests check the column code against it with
Hypothesis and on the benchmark corpus. Nothing is cached between calls.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from operator import itemgetter
from typing import Any

from dedup_pipeline.core.errors import NESTING_TOO_DEEP, RecordError
from dedup_pipeline.core.fields import (
    NUMERIC_FIELDS,
    UPPER_CASE_FIELDS,
    VOLATILE_FIELDS,
    canonical_fields,
    field_value,
    is_blank,
    record_url,
)
from dedup_pipeline.core.hashing import IDENTITY_FIELDS, V2_REQUIRED, compute_hashes, content_v1_field, hash_rule
from dedup_pipeline.core.numbers import currency_exponent, parse_decimal, plain_decimal

_SEP = "\x00"  # separates values and records in joined text; JSON text never holds it raw
_CHECK_JOINER = " | "  # joins a text column to be checked: "  " then reveals a value's leading or trailing space
_CONTROLS = tuple(map(chr, range(32)))  # ASCII control characters (DEL needs neither normalising nor escaping)
_encode_str = json.encoder.encode_basestring  # exactly what json.dumps(ensure_ascii=False) writes for a str
_needs_escape = re.compile(r'[\x01-\x1f"\\]').search
_sha256 = hashlib.sha256
_JSON_BOOL = {True: "true", False: "false"}
_SMALL_INT = 10**18  # ints below this are exact through Decimal arithmetic at the default precision
_PLAIN_INT = re.compile(r"-?[0-9]{1,18}").fullmatch
_PLAIN_DECIMAL = re.compile(r"(-?)([0-9]{1,18})(?:\.([0-9]{1,18}))?").fullmatch
_VECTORISED = frozenset({"content/1", "content/2"})
#: Records processed as one set of columns: small enough that a block's records stay
#: in the CPU cache across the passes over its columns, large enough to spread the
#: per-column work (measured best between 128 and 512 on the benchmark corpus).
BLOCK = 256


@dataclass(slots=True)
class HashedRecords:
    """Per record of a chunk: canonical fields, what canonicalisation raised, a digest or a reason per version."""

    payloads: list[dict[str, Any] | None]  # `canonical_fields(record)`; None where it raised or was not asked for
    failures: list[RecordError | None]  # what `canonical_fields(record)` raised
    digests: dict[str, list[str | None]]  # version -> digest per record (None: see errors or failures)
    errors: dict[str, list[str | None]]  # version -> why the rule could not hash the record


def hash_records(
    records: Sequence[Mapping[str, Any]],
    versions: Sequence[str],
    *,
    payloads: bool = True,
    urls: Sequence[str | None] | None = None,
) -> HashedRecords:
    """`canonical_fields`, then `compute_hashes(…, versions)`, for every record of a chunk, column-wise.

    `payloads=False` skips building the canonical dicts when only digests are
    wanted. `urls`, when given, holds for each record with a str ``url`` its URL
    as it is to be stored and hashed, already computed by the caller (`record_url`'s
    form, or its `identity_url` under the warehouse's URL version).
    Exceptions other than `RecordError` propagate, as on the per-record path.
    """
    for version in versions:
        hash_rule(version)  # unknown versions are an error, never a default
    out = HashedRecords([], [], {v: [] for v in versions}, {v: [] for v in versions})
    for start in range(0, len(records), BLOCK):
        part = _hash_block(
            records[start : start + BLOCK],
            versions,
            payloads,
            urls[start : start + BLOCK] if urls is not None else None,
        )
        out.payloads += part.payloads
        out.failures += part.failures
        for version in versions:
            out.digests[version] += part.digests[version]
            out.errors[version] += part.errors[version]
    return out


def _hash_block(records: Sequence[Mapping[str, Any]], versions: Sequence[str], payloads: bool, urls) -> HashedRecords:
    n = len(records)
    out = HashedRecords([None] * n, [None] * n, {v: [None] * n for v in versions}, {v: [None] * n for v in versions})
    generic = [v for v in versions if v not in _VECTORISED]
    run = _Run(records, versions, payloads or bool(generic), urls, out)
    if n:
        run.all_rows()
    for i in run.slow:
        _per_record(records[i], i, versions, out)
    if generic:
        slow = set(run.slow)
        for i, payload in enumerate(out.payloads):
            if payload is not None and i not in slow:
                digests, errors = compute_hashes(payload, generic)
                for version in generic:
                    out.digests[version][i] = digests.get(version)
                    out.errors[version][i] = errors.get(version)
    if not payloads:
        out.payloads = [None] * n
    return out


def content_hashes(records: Sequence[Mapping[str, Any]], version: str = "content/2") -> list[str]:
    """``content_hash(record, version)[0]`` for every record; raises what the first unhashable record raises."""
    hashed = hash_records(records, (version,), payloads=False)
    digests, errors = hashed.digests[version], hashed.errors[version]
    for i, digest in enumerate(digests):
        if digest is None:
            exc = hashed.failures[i] or RecordError(errors[i])
            exc.add_note(f"record {i} of the batch")
            raise exc
    return digests  # type: ignore[return-value]


def _per_record(record: Mapping[str, Any], i: int, versions: Sequence[str], out: HashedRecords) -> None:
    """The per-record path, for the records the column code hands over."""
    try:
        payload = canonical_fields(record)
        digests, errors = compute_hashes(payload, versions)
    except RecordError as exc:
        out.failures[i] = exc
        return
    except RecursionError:  # a record built in memory; parse_line refuses lines nested this deep
        out.failures[i] = RecordError(NESTING_TOO_DEEP)
        return
    out.payloads[i] = payload
    for version in versions:
        out.digests[version][i] = digests.get(version)
        out.errors[version][i] = errors.get(version)


# ------------------------------------------------------------------ groups of records with the same fields


class _Run:
    """One call of `hash_records`: splits the records into groups and runs each group as columns."""

    def __init__(self, records, versions, keep_payloads: bool, urls, out: HashedRecords):
        self.records, self.versions, self.keep_payloads, self.urls, self.out = (
            records,
            versions,
            keep_payloads,
            urls,
            out,
        )
        self.slow: list[int] = []

    def all_rows(self) -> None:
        """Group the records by their field names (in order), then run each group as columns."""
        records = self.records
        shapes = list(map(tuple, records))  # reads the keys only, never a volatile value
        groups: dict[tuple, list[int]] = {}
        if shapes.count(shapes[0]) == len(shapes):
            groups[shapes[0]] = list(range(len(shapes)))
        else:
            for i, shape in enumerate(shapes):
                rows = groups.get(shape)
                if rows is None:
                    groups[shape] = [i]
                else:
                    rows.append(i)
        for shape, rows in groups.items():
            keys = [k for k in shape if k not in VOLATILE_FIELDS]
            group = records if len(rows) == len(records) else [records[i] for i in rows]
            if len(keys) > 1:  # row by row, so each record is read once while it is in the cache
                values = list(zip(*map(itemgetter(*keys), group)))
            else:
                values = [list(map(itemgetter(*keys), group))] if keys else []
            self.group(rows, keys, values)

    def group(self, rows: list[int], keys: list, values: list[list]) -> None:
        """Records `rows`, whose non-volatile fields are `keys` with `values` (a list per key): columns, digests."""
        if not all(type(k) is str for k in keys):
            self.slow.extend(rows)
            return
        types = [set(map(type, column)) for column in values]
        if any(type(None) in t for t in types):  # a None drops its field: such records form groups of their own
            nones = {
                j for column, t in zip(values, types) if type(None) in t for j, v in enumerate(column) if v is None
            }
            sub: dict[tuple, list[int]] = {}
            for j in sorted(nones):
                shape = tuple(k for k, column in zip(keys, values) if column[j] is not None)
                sub.setdefault(shape, []).append(j)
            for shape, positions in sub.items():
                self.group(
                    [rows[j] for j in positions],
                    list(shape),
                    [[column[j] for j in positions] for k, column in zip(keys, values) if k in shape],
                )
            keep = [j for j in range(len(rows)) if j not in nones]
            if not keep:
                return
            rows = [rows[j] for j in keep]
            values = [[column[j] for j in keep] for column in values]
            types = [set(map(type, column)) for column in values]
        columns = [self.column(k, column, t, rows) for k, column, t in zip(keys, values, types)]
        bad = set().union(*(c.bad for c in columns))
        if bad:
            self.slow.extend(rows[j] for j in sorted(bad))
            keep = [j for j in range(len(rows)) if j not in bad]
            if not keep:
                return
            rows = [rows[j] for j in keep]
            for c in columns:
                c.keep(keep)
        self.hash_group(rows, keys, columns)

    def hash_group(self, rows: list[int], keys: list[str], columns: list[_Column]) -> None:
        payloads = None
        if self.keep_payloads or "content/2" in self.versions:
            payloads = (
                [dict(zip(keys, row)) for row in zip(*(c.canonical for c in columns))] if keys else [{} for _ in rows]
            )
            if self.keep_payloads:
                for i, payload in zip(rows, payloads):
                    self.out.payloads[i] = payload
        if "content/1" in self.versions:
            fields = sorted((k, c.v1_quoted, c.v1) for k, c in zip(keys, columns))
            self.store("content/1", rows, _digests(fields, len(rows)), payloads)
        if "content/2" in self.versions:
            canonical = {k: c.canonical for k, c in zip(keys, columns)}
            known = {k: (c.v1_quoted, c.v1) for k, c in zip(keys, columns) if c.normalised}
            self.store("content/2", rows, _content_v2(canonical, len(rows), known), payloads)

    def store(self, version: str, rows: list[int], digests: list[str | None] | None, payloads) -> None:
        """Digests per row; a row the columns left out (None) is hashed by the rule itself."""
        out_digests, out_errors = self.out.digests[version], self.out.errors[version]
        if digests is None:
            digests = [None] * len(rows)
        elif len(rows) == len(out_digests) and None not in digests:  # the whole chunk, every row done
            out_digests[:] = digests
            return
        rule = hash_rule(version)
        for j, (i, digest) in enumerate(zip(rows, digests)):
            if digest is None:
                try:
                    digest = rule.digest(payloads[j] if payloads is not None else canonical_fields(self.records[i]))
                except RecordError as exc:
                    out_errors[i] = str(exc)
                    continue
            out_digests[i] = digest

    def column(self, key: str, values: list, types: set, rows: list[int]) -> _Column:
        """One field of a group: its canonical values and their `content/1` JSON."""
        kind = next(iter(types)) if len(types) == 1 else None
        if kind is str:
            if key == "url":
                urls = [self.urls[i] for i in rows] if self.urls is not None else list(map(record_url, values))
                column = _text_column(urls, normalise=False, upper=False)
            elif key not in NUMERIC_FIELDS:
                column = _text_column(values, normalise=True, upper=key in UPPER_CASE_FIELDS)
            else:  # numeric text ("9.90") as its numbers; if one is none ("call for price"): value by value
                numbers = _numbers(values, key)
                column = _decimal_column(key, numbers) if numbers is not None else None
            if column is not None:
                return column
        elif kind is float:
            if all(map(math.isfinite, values)):
                return _Column(values, True, _formatted("%.4f", values))
        elif kind is int:
            if -_SMALL_INT < min(values) and max(values) < _SMALL_INT:
                return _Column(values, False, list(map(str, values)))
        elif kind is bool:
            return _Column(values, False, [_JSON_BOOL[v] for v in values])
        elif kind is Decimal:
            return _decimal_column(key, values)
        return self.value_by_value(key, values, rows)

    def value_by_value(self, key: str, values: list, rows: list[int]) -> _Column:
        """The per-record functions, one value at a time; a value they refuse sends its record the per-record way."""
        canonical, v1, bad = [], [], set()
        for j, value in enumerate(values):
            try:
                if key == "url" and isinstance(value, str):
                    value = self.urls[rows[j]] if self.urls is not None else record_url(value)
                else:
                    value = field_value(key, value)
                text = json.dumps(
                    content_v1_field(key, value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
                )
            except Exception:  # noqa: BLE001 - the per-record path raises it again, or reports it
                bad.add(j)
                value = text = None
            canonical.append(value)
            v1.append(text)
        return _Column(canonical, False, v1, bad)


class _Column:
    """One field over a group: canonical values, and the `content/1` JSON of each (`v1_quoted`: text to quote)."""

    __slots__ = ("canonical", "v1_quoted", "v1", "bad", "normalised")

    def __init__(
        self, canonical: list, v1_quoted: bool, v1: list[str], bad: set[int] | None = None, normalised: bool = False
    ):
        self.canonical, self.v1_quoted, self.v1, self.bad = canonical, v1_quoted, v1, bad or set()
        self.normalised = normalised  # text both hash rules' normalisation leaves as it is: v1 is their JSON

    def keep(self, positions: list[int]) -> None:
        self.canonical = [self.canonical[j] for j in positions]
        self.v1 = [self.v1[j] for j in positions]


# ------------------------------------------------------------------ text columns


def _normalised(values: list[str], upper: bool = False) -> tuple[list[str], str | None] | None:
    """`normalise_text` of every value (then upper case): (values, their joined text when printable ASCII).

    None when a value holds NUL (the separator of the joined column) itself.
    """
    joined = _CHECK_JOINER.join(values)
    if (
        joined.isascii()
        and "  " not in joined
        and joined[:1] != " "
        and joined[-1:] != " "
        and not any(c in joined for c in _CONTROLS)
    ):  # printable ASCII with single spaces inside values only: normalise_text changes nothing
        if upper and not joined.isupper():  # isupper: no a-z at all, so upper() changes nothing
            values = list(map(str.upper, values))
        return values, joined
    if (
        "  " not in joined and joined[:1] != " " and joined[-1:] != " " and unicodedata.is_normalized("NFC", joined)
    ):  # NFC already, no space runs or edge spaces: only whitespace other than " " (never printable) can change
        if not joined.isprintable():
            if _SEP in joined:
                return None
            values = [v if v.isprintable() else " ".join(v.split()) for v in values]
        return (list(map(str.upper, values)) if upper else values), None
    joined = _SEP.join(values)
    if joined.count(_SEP) != len(values) - 1:
        return None
    if not joined.isascii():
        joined = unicodedata.normalize("NFC", joined)
    joined = " ".join(joined.split())
    if " \x00" in joined:
        joined = joined.replace(" \x00", "\x00")
    if "\x00 " in joined:
        joined = joined.replace("\x00 ", "\x00")
    if upper:
        joined = joined.upper()
    return joined.split(_SEP), None


def _json_strings(values: list[str], clean: str | None) -> tuple[bool, list[str]] | None:
    """(quoted, texts): the values as they are when JSON needs no escape in them, else JSON-encoded.

    `clean` is their joined text when known to be printable ASCII. None when a
    value holds a lone surrogate (not UTF-8: the rule reports it).
    """
    if clean is None:
        clean = _CHECK_JOINER.join(values)
        # Control characters and lone surrogates are never printable: only such values need a closer look.
        odd = () if clean.isprintable() else [v for v in values if not v.isprintable()]
        for value in odd:
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    return None
        if any(map(_needs_escape, odd)):
            return False, list(map(_encode_str, values))
    return (False, list(map(_encode_str, values))) if '"' in clean or "\\" in clean else (True, values)


def _text_column(values: list[str], normalise: bool, upper: bool) -> _Column | None:
    """A column of str: canonical text (or the URLs as given) and its `content/1` JSON (normalised once more)."""
    if normalise:
        done = _normalised(values, upper)
        if done is None:
            return None
        canonical, clean = done
    else:
        canonical, clean = values, None
    # content/1 (and content/2) normalise the canonical text again. Normalising is idempotent (NFC is, and a
    # collapsed space composes with nothing), so that changes nothing on text normalised here, unless it was
    # upper-cased since.
    normalised = normalise and not upper
    if clean is None and not normalised:
        done = _normalised(canonical)
        if done is None:
            return None
        v1, clean = done
    else:
        v1 = canonical
    encoded = _json_strings(v1, clean)
    if encoded is None:
        return None
    return _Column(canonical, encoded[0], encoded[1], normalised=normalised)


# ------------------------------------------------------------------ numbers


def _formatted(fmt: str, values: list) -> list[str]:
    """``fmt % value`` for every value, in one format call."""
    return ((fmt + _SEP) * len(values) % tuple(values)).split(_SEP)[:-1]


def _numbers(values: list[str], key: str) -> list[Decimal] | None:
    """The exact numbers numeric texts read as, or None if one does not read as one."""
    try:
        return [parse_decimal(value, key) for value in values]
    except RecordError:
        return None


def _decimal_column(key: str, values: list[Decimal]) -> _Column:
    """Exact numbers: plain decimal text in `record/1`; in `content/1` that text, or ``.4f`` in numeric fields."""
    numeric = key in NUMERIC_FIELDS
    canonical, v1, bad = [], [], set()
    for j, number in enumerate(values):
        try:
            text = plain_decimal(number)  # refuses what is not finite, or too long to write out exactly
        except RecordError:
            bad.add(j)  # the per-record path reports it
            canonical.append(None)
            v1.append("")
            continue
        canonical.append(text)
        v1.append(format(Decimal(text), ".4f") if numeric else text)
    return _Column(canonical, True, v1, bad)


# ------------------------------------------------------------------ JSON objects and digests


def _digests(fields: list[tuple[str, bool, list[str]]], n: int) -> list[str | None]:
    """SHA-256 of ``{"k1":v1,"k2":v2,...}`` for each of `n` rows, in the order of `fields`.

    `fields` are (name, quoted, texts): the JSON of row r's value is texts[r],
    in quotes when quoted. All rows are written by one join; None for a row
    whose text is not UTF-8 (a lone surrogate).
    """
    width = 2 * len(fields) + 1
    flat: list[str | None] = [None] * (n * width)
    close = ""
    for j, (name, quoted, texts) in enumerate(fields):
        quote = '"' if quoted else ""
        flat[2 * j :: width] = [("{" if j == 0 else close + ",") + _encode_str(name) + ":" + quote] * n
        flat[2 * j + 1 :: width] = texts
        close = quote
    flat[width - 1 :: width] = [(close + "}" if fields else "{}") + _SEP] * n
    text = "".join(flat)
    try:
        blobs = text.encode("utf-8").split(b"\x00")
    except UnicodeEncodeError:
        return _digests_one_by_one(text.split(_SEP)[:n])
    return [_sha256(blob).hexdigest() for blob in blobs[:n]]


def _digests_one_by_one(texts: list[str]) -> list[str | None]:
    digests: list[str | None] = []
    for text in texts:
        try:
            digests.append(_sha256(text.encode("utf-8")).hexdigest())
        except UnicodeEncodeError:
            digests.append(None)
    return digests


# ------------------------------------------------------------------ content/2 from canonical columns


def _v2_text(values: list, upper: bool) -> tuple[bool, list[str]] | None:
    """`content/2`'s text of a column of canonical values (normalised, currency upper case), as JSON strings."""
    types = set(map(type, values))
    if types == {int}:
        if -_SMALL_INT < min(values) and max(values) < _SMALL_INT:
            return True, list(map(str, values))
        return None
    if types != {str}:
        return None
    done = _normalised(values, upper)
    if done is None:
        return None
    return _json_strings(*done)


def _v2_minor_units(canonical: dict[str, list]) -> list[int | None] | None:
    """Exact minor units per row, None for a row (or for all) to leave to the rule."""
    if "price_minor" in canonical:
        values = canonical["price_minor"]
        types = set(map(type, values))
        if types == {int}:
            return [v if -_SMALL_INT < v < _SMALL_INT else None for v in values]
        if types == {str}:
            return [int(v) if _PLAIN_INT(v) else None for v in values]
        return None
    if "price" not in canonical:
        return None
    values, currencies = canonical["price"], canonical["currency"]
    types = set(map(type, values))
    if types == {int}:
        return [
            v * 10 ** currency_exponent(c) if -_SMALL_INT < v < _SMALL_INT else None for v, c in zip(values, currencies)
        ]
    if types != {str}:
        return None
    minors: list[int | None] = []
    for value, currency in zip(values, currencies):
        match = _PLAIN_DECIMAL(value)
        if match is None:
            minors.append(None)  # "call for price", exponent notation...: the rule decides
            continue
        sign, whole, fraction = match.groups()
        exponent = currency_exponent(currency)
        fraction = fraction or ""
        if len(fraction) > exponent:
            minors.append(None)  # not a whole number of minor units: the rule keeps the exact decimal
            continue
        minor = int(whole + fraction.ljust(exponent, "0"))
        minors.append(-minor if sign else minor)
    return minors


def _content_v2(
    canonical: dict[str, list], n: int, known: dict[str, tuple[bool, list[str]]]
) -> list[str | None] | None:
    """`content/2` digests of a group from its canonical columns; None (per row, or for all) to leave to the rule.

    `known` holds the JSON text of the columns whose canonical text the rule's normalisation leaves as it is.
    """
    if not all(f in canonical for f in V2_REQUIRED) or set(map(type, canonical["currency"])) != {str}:
        return None  # a missing field's error, or a currency to_minor_units would not read: the rule decides
    texts = {}
    for name in (*V2_REQUIRED, "description"):
        if name in canonical:
            encoded = known.get(name) or _v2_text(canonical[name], upper=name == "currency")
            if encoded is None:
                return None
            texts[name] = encoded
    minors = _v2_minor_units(canonical)
    if minors is None:
        return None
    for name in V2_REQUIRED:  # a blank one is missing: the rule raises its error
        column = canonical[name]
        if "" in column:  # canonical text is normalised, so a column without "" has no blank value
            minors = [None if is_blank(value) else minor for value, minor in zip(column, minors)]
    fields = []
    for name in sorted(IDENTITY_FIELDS):
        if name == "price_minor":
            fields.append((name, False, [str(m) for m in minors]))
        elif name in texts:
            fields.append((name, *texts[name]))
        else:
            fields.append((name, False, ["null"] * n))  # description absent: JSON null
    digests = _digests(fields, n)
    return [d if m is not None else None for d, m in zip(digests, minors)]


__all__ = ["HashedRecords", "content_hashes", "hash_records"]
