"""Parse one landing line and canonicalise it into the form the warehouse keeps.

Pure functions, no I/O. A line that cannot be used raises `RecordError` with a
reason that names the rule and the field, never the value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dedup_pipeline.core.canonical import hash_records
from dedup_pipeline.core.errors import MAX_NESTING, NESTING_TOO_DEEP, RecordError
from dedup_pipeline.core.fields import RECORD_VERSION, canonical_fields, is_blank
from dedup_pipeline.core.hashing import compute_hashes
from dedup_pipeline.core.numbers import OUT_OF_RANGE, json_decimal
from dedup_pipeline.core.url import URL_VERSION, UrlError, canonical_url, without_userinfo

#: Fields whose text feeds near-duplicate detection, in order.
TEXT_FIELDS = ("title", "description")
#: Natural key used when the configuration names none.
DEFAULT_NATURAL_KEY = ("canonical_url",)
#: Longest natural key (UTF-8 bytes): a PostgreSQL B-tree entry holds at most 2704 bytes, so a longer key
#: could never be stored under the UNIQUE index; 2048 is the sitemaps protocol's URL limit.
MAX_NATURAL_KEY_BYTES = 2048


def _reject_constant(name: str) -> Any:
    raise RecordError(f"JSON constant {name} is not allowed")


def _object_without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        repeated = next(key for key, _ in pairs if key in seen or seen.add(key))
        key = json.dumps(repeated[:100])  # escaped: a key may hold what a reason must not (NUL, lone surrogates)
        raise RecordError(f"duplicate key {key} in a JSON object (which of its values is meant is unknown)")
    return value


#: One decoder for every line: `json.loads` with these options would build a new one (and its scanner) per call.
#: The hook costs less than telling beforehand which lines might repeat a key (benchmarks/bench_canonical.py).
_DECODER = json.JSONDecoder(
    parse_float=json_decimal, parse_constant=_reject_constant, object_pairs_hook=_object_without_repeated_keys
)


def _check_strings(value: Any, path: str = "record") -> None:
    """Refuse text that no warehouse can store exactly: NUL characters and lone surrogates."""
    if isinstance(value, str):
        if "\x00" in value:
            raise RecordError(f"{path}: NUL character in text")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise RecordError(f"{path}: lone surrogate in text (not valid Unicode)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key, f"{path} key")
            _check_strings(item, f"{path}.{key}" if path == "record" else path)
    elif isinstance(value, list):
        for item in value:
            _check_strings(item, path)


def _nested_deeper_than(record: dict, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels deep in `record` (walked without recursion)."""
    pending = [(record, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > limit:
            return True
        pending.extend(
            (child, depth + 1)
            for child in (value.values() if isinstance(value, dict) else value)
            if isinstance(child, (dict, list))
        )
    return False


def parse_line(raw: bytes | str) -> dict[str, Any]:
    """One JSON Lines record as a dict, numbers read exactly (Decimal, never float).

    *raw* is the line's bytes as the landing file holds them (UTF-8), or the line already decoded.
    """
    if isinstance(raw, str):
        text = raw
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(f"invalid UTF-8 at byte {exc.start}") from None
        except AttributeError:
            raise TypeError(f"parse_line takes bytes or a str, got {type(raw).__name__}") from None
    try:
        if text.startswith("\ufeff"):  # json.loads refuses a byte-order mark; the decoder alone would not
            message = "a byte-order mark starts the line (only the file's first line may have one)"
            raise json.JSONDecodeError(message, text, 0)
        value = _DECODER.decode(text)
    except RecordError:
        raise
    except json.JSONDecodeError as exc:
        raise RecordError(f"malformed JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}") from None
    except RecursionError:
        raise RecordError(NESTING_TOO_DEEP) from None
    except ValueError:  # an integer beyond Python's int <-> str digit limit
        raise RecordError(OUT_OF_RANGE) from None
    if not isinstance(value, dict):
        raise RecordError(f"a record must be a JSON object, got {type(value).__name__}")
    if text.count("[") + text.count("{") > MAX_NESTING and _nested_deeper_than(value, MAX_NESTING):
        raise RecordError(NESTING_TOO_DEEP)
    if "\\u" in text or "\\U" in text:  # escapes are the only way to smuggle NUL or lone surrogates in
        for key, item in value.items():
            _check_strings(key, "record key")
            _check_strings(item, f"field '{key}'")
    return value


def parse_timestamp(value: Any) -> datetime | None:
    """An ISO 8601 timestamp as an aware UTC datetime, or None when absent or unreadable."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)
    except (
        ValueError,
        OverflowError,
    ):  # OverflowError: in UTC it falls outside years 1-9999 ("0001-01-01T00:00+01:00")
        return None


@dataclass(slots=True)
class CanonicalRecord:
    """A record ready for the exact rung: identity, hashes and the payload to store.

    `payload` is a dict, or its JSON text when read back from `canonical_records`
    (`store.json_text.EncodedJson`, decoded only where its fields are needed).
    """

    line_no: int
    canonical_url: str
    natural_key: str
    payload: dict[str, Any] | str
    hashes: dict[str, str]
    hash_errors: dict[str, str] = field(default_factory=dict)
    crawled_at: datetime | None = None
    url_version: str = URL_VERSION


def natural_key_of(payload: Mapping[str, Any], canonical: str, key_fields: Sequence[str]) -> str:
    """The natural key string: the single field's value, or a JSON array of several."""
    values = []
    for name in key_fields:
        value = canonical if name == "canonical_url" else payload.get(name)
        if is_blank(value):
            raise RecordError(f"missing natural-key field '{name}'")
        values.append(value if isinstance(value, str) else json.dumps(value, sort_keys=True))
    key = values[0] if len(values) == 1 else json.dumps(values, ensure_ascii=False)
    if len(key) * 4 > MAX_NATURAL_KEY_BYTES and len(key.encode("utf-8")) > MAX_NATURAL_KEY_BYTES:
        raise RecordError(f"natural key too long ({len(key.encode('utf-8'))} bytes; at most {MAX_NATURAL_KEY_BYTES})")
    return key


def _canonical_url_of(record: Mapping[str, Any]) -> str:
    """The record's URL in `record/1` form (`url/1` without userinfo); RecordError when it is missing, not text or
    not canonicalisable."""
    url = record.get("url")
    if url is None or (isinstance(url, str) and not url.strip()):
        raise RecordError("missing url")
    if not isinstance(url, str):
        raise RecordError(f"url must be text, got {type(url).__name__}")
    try:
        return canonical_url(without_userinfo(url), strict=True, version="url/1")
    except UrlError as exc:
        raise RecordError(f"invalid url: {exc}") from None


def identity_url(record_form: str, url_version: str) -> str:
    """The record's identity URL under `url_version`, from its `record/1` URL (no userinfo, `url/1` rules).

    Without userinfo, `url/2` differs from `url/1` only in an IPv6 host, the one place a "[" can be.
    """
    if url_version == "url/1" or "[" not in record_form:
        return record_form
    try:
        return canonical_url(record_form, strict=True, version=url_version)
    except UrlError as exc:
        raise RecordError(f"invalid url: {exc}") from None


def migrated_key(natural_key: str, url_version: str) -> str:
    """A stored natural key under `url_version`: a URL key (or a composite key's URL) in that version's form.

    Keys that are not http(s) URLs (a SKU, an e-mail address) are unchanged.
    """
    if natural_key.startswith("["):
        try:
            values = json.loads(natural_key)
        except ValueError:
            return natural_key
        if isinstance(values, list) and all(isinstance(v, str) for v in values):
            return json.dumps([migrated_key(v, url_version) for v in values], ensure_ascii=False)
        return natural_key
    if not natural_key[:4].lower() == "http":
        return natural_key
    try:
        return canonical_url(natural_key, strict=True, version=url_version)
    except UrlError:
        return natural_key


def canonicalise_record(
    record: Mapping[str, Any],
    line_no: int,
    hash_versions: Sequence[str],
    active_version: str,
    key_fields: Sequence[str] = DEFAULT_NATURAL_KEY,
    url_version: str = URL_VERSION,
) -> CanonicalRecord:
    """Canonical URL (under `url_version`), canonical payload, natural key and a digest per version.

    The URL's userinfo is dropped first, under every URL version: credentials
    are not the record's identity, and are never stored, hashed or logged.

    Raises RecordError when the URL is missing or invalid, the natural key is
    incomplete, or the active hash version cannot be computed. Other versions
    that fail are kept as `hash_errors` (reported by the rehash job, never
    silently given a hash).
    """
    canonical = identity_url(_canonical_url_of(record), url_version)
    try:
        payload = canonical_fields(record)
        payload["url"] = canonical  # content/1 hashes the URL as the payload stores it: in the warehouse's version
        digests, errors = compute_hashes(payload, hash_versions)
    except RecursionError:  # a record built in memory; parse_line refuses lines nested this deep
        raise RecordError(NESTING_TOO_DEEP) from None
    if active_version in errors:
        raise RecordError(errors[active_version])
    return CanonicalRecord(
        line_no=line_no,
        canonical_url=canonical,
        natural_key=natural_key_of(payload, canonical, key_fields),
        payload=payload,
        hashes=digests,
        hash_errors=errors,
        crawled_at=parse_timestamp(record.get("scraped_at")),
        url_version=url_version,
    )


def canonicalise_records(
    records: Sequence[Mapping[str, Any]],
    line_nos: Sequence[int],
    hash_versions: Sequence[str],
    active_version: str,
    key_fields: Sequence[str] = DEFAULT_NATURAL_KEY,
    url_version: str = URL_VERSION,
) -> list[CanonicalRecord | RecordError]:
    """`canonicalise_record` for a chunk of records: the same results, or the same `RecordError`, per record.

    The canonical fields and hashes are computed column-wise over the chunk
    (`dedup_pipeline.core.canonical`), and each URL is canonicalised once, for the
    record's identity and its hashes alike.
    """
    results: list[CanonicalRecord | RecordError | None] = [None] * len(records)
    todo: list[int] = []
    urls: list[str] = []
    for i, record in enumerate(records):
        try:
            urls.append(identity_url(_canonical_url_of(record), url_version))
        except RecordError as exc:
            results[i] = exc
            continue
        todo.append(i)
    hashed = hash_records([records[i] for i in todo], hash_versions, urls=urls)
    columns = [(v, hashed.digests[v], hashed.errors[v]) for v in hash_versions]
    for j, i in enumerate(todo):
        if hashed.failures[j] is not None:
            results[i] = hashed.failures[j]
            continue
        errors = {v: reasons[j] for v, _, reasons in columns if reasons[j] is not None}
        if active_version in errors:
            results[i] = RecordError(errors[active_version])
            continue
        payload = hashed.payloads[j]
        canonical = urls[j]
        payload["url"] = canonical
        try:
            natural_key = natural_key_of(payload, canonical, key_fields)
        except RecordError as exc:
            results[i] = exc
            continue
        results[i] = CanonicalRecord(
            line_no=line_nos[i],
            canonical_url=canonical,
            natural_key=natural_key,
            payload=payload,
            hashes={v: digests[j] for v, digests, _ in columns if digests[j] is not None},
            hash_errors=errors,
            crawled_at=parse_timestamp(records[i].get("scraped_at")),
            url_version=url_version,
        )
    return results  # type: ignore[return-value]


__all__ = [
    "RECORD_VERSION",
    "URL_VERSION",
    "migrated_key",
    "CanonicalRecord",
    "RecordError",
    "canonicalise_record",
    "canonicalise_records",
    "parse_line",
    "parse_timestamp",
    "natural_key_of",
]
