"""Versioned content-hash rules (the registry) and the public `content_hash`.

Each rule turns a record's canonical fields (`record/1`, see `dedup_pipeline.core.fields`) into one deterministic
byte string and hashes it with SHA-256. Because the canonical form is idempotent, a raw record and its stored
payload hash the same (except, in a `url/2` warehouse, a URL with an IPv6 host, which the ladder hashes in its
`url/2` form: `records.identity_url`). A rule is never edited in place: a changed rule is a new version string,
migrated to by the rehash job. The version is stored beside every digest, and digests of different versions are
never compared.

`content/1` is the seeds' first rule over `record/1` fields: every field,
keys sorted, the price fields (`price`, `price_minor`: a number or numeric
text) in the fixed form ``format(x, ".4f")``; other decimals are exact text in
`record/1` already. It is not the seeds' `canonicalise` byte for byte: numeric
price text, other and nested decimals, nested text and nulls, the currency's
case, three more volatile fields and the URL (in its `url/1` form) differ; the
docs/canonical.md says how and why, and `test_hashing.py` pins it.

`content/2` is the seeds' second rule: a fixed tuple of identity fields, the
price in exact minor units, floats refused. `title`, `price` (or
`price_minor`), `currency` and `seller_id` are required: absent or blank
(`is_blank`: "" or whitespace only, a failed extraction), the record cannot be
hashed, rather than sharing one digest with every other record whose
extraction failed the same way. Adding a field to a record does
not change its `content/2` digest; the URL is not part of it, so the same
listing served under two URLs is one content.

`dedup_pipeline.core.canonical` computes both rules column-wise over a chunk of
records (the ladder's path); these per-record functions are its specification,
and its tests check it against them. A new rule works there at once (it is
applied record by record); a vectorised version of it is an addition there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.fields import NUMERIC_FIELDS, canonical_fields, is_blank, normalise_text
from dedup_pipeline.core.numbers import parse_decimal, plain_decimal, to_minor_units

#: The fixed identity tuple of `content/2`.
IDENTITY_FIELDS = ("title", "price_minor", "currency", "seller_id", "description")


# One encoder for every digest: json.dumps with non-default options builds a new one per call.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _dumps(payload: Any) -> bytes:
    try:
        return _ENCODER.encode(payload).encode("utf-8")
    except UnicodeEncodeError:
        raise RecordError("text contains a lone surrogate (not valid Unicode)") from None


# ---------------------------------------------------------------- content/1


def _fixed_number(value: Decimal | float) -> str:
    return format(value, ".4f")


def _v1_value(value: Any) -> Any:
    if isinstance(value, str):
        return normalise_text(value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, (float, Decimal)):
        if not (value == value and abs(value) != float("inf")):
            raise RecordError("content/1: number is not finite")
        return _fixed_number(value)
    if isinstance(value, Mapping):
        return {str(k): _v1_value(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_v1_value(v) for v in value]
    raise RecordError(f"content/1: unsupported value type {type(value).__name__}")


def content_v1_field(key: Any, value: Any) -> Any:
    """One canonical field as `content/1` serialises it (numeric fields' text in the fixed form ``.4f``)."""
    if key in NUMERIC_FIELDS and isinstance(value, str):
        try:
            return _fixed_number(parse_decimal(value, key))
        except RecordError:
            return value  # "call for price" stays text
    return _v1_value(value)


def content_v1_bytes(fields: Mapping[str, Any]) -> bytes:
    """The seeds' first rule over canonical fields: every field, numbers in the fixed form ``.4f``."""
    return _dumps({key: content_v1_field(key, value) for key, value in fields.items()})


# ---------------------------------------------------------------- content/2

#: The text identity fields a record must have (and a price, `price` or `price_minor`): absent or blank, it cannot
#: be hashed.
V2_REQUIRED = ("title", "currency", "seller_id")


def _missing(field: str) -> RecordError:
    return RecordError(f"content/2: missing identity field '{field}'")


def _v2_text(record: Mapping[str, Any], field: str) -> str | None:
    value = record.get(field)
    if field in V2_REQUIRED and is_blank(value):  # "" or "   " is a failed extraction, not a value
        raise _missing(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise RecordError(f"content/2: field '{field}' must be text, got {type(value).__name__}")
    return normalise_text(str(value))


def _v2_price_minor(record: Mapping[str, Any]) -> int | str:
    if record.get("price_minor") is not None:
        minor = parse_decimal(record["price_minor"], "price_minor")
    elif not is_blank(record.get("price")):
        price = parse_decimal(record["price"], "price")
        minor = to_minor_units(price, record.get("currency") if isinstance(record.get("currency"), str) else None)
    else:
        raise _missing("price")
    if isinstance(minor, Decimal) and minor == minor.to_integral_value():
        minor = int(minor)  # exact: no rounding to the decimal context's 28 digits
    return minor if isinstance(minor, int) else plain_decimal(minor)


def content_v2_bytes(record: Mapping[str, Any]) -> bytes:
    """The seeds' second rule: the fixed identity tuple, exact minor-unit price."""
    currency = _v2_text(record, "currency")
    payload = {
        "title": _v2_text(record, "title"),
        "price_minor": _v2_price_minor(record),
        "currency": currency.upper() if currency else currency,
        "seller_id": _v2_text(record, "seller_id"),
        "description": _v2_text(record, "description"),
    }
    return _dumps(payload)


# ---------------------------------------------------------------- registry


@dataclass(frozen=True)
class HashRule:
    """One versioned way of turning a record into a SHA-256 digest."""

    version: str
    summary: str
    canonical_bytes: Callable[[Mapping[str, Any]], bytes]

    def digest(self, fields: Mapping[str, Any]) -> str:
        """Hex SHA-256 of canonical fields (`canonical_fields(record)`); RecordError when the rule cannot apply."""
        return hashlib.sha256(self.canonical_bytes(fields)).hexdigest()


HASH_RULES: dict[str, HashRule] = {
    rule.version: rule
    for rule in (
        HashRule("content/1", "all non-volatile fields, url/1 URL, numbers as .4f", content_v1_bytes),
        HashRule(
            "content/2",
            "identity tuple (title, price_minor, currency, seller_id, description), floats refused",
            content_v2_bytes,
        ),
    )
}
#: The version a fresh warehouse dedups on; the warehouse stores the active one.
INITIAL_ACTIVE_VERSION = "content/1"


def hash_rule(version: str) -> HashRule:
    """The registered rule for `version`; unknown versions are an error, never a default."""
    try:
        return HASH_RULES[version]
    except KeyError:
        raise ValueError(f"unknown hash version {version!r}; known: {sorted(HASH_RULES)}") from None


def content_hash(record: Mapping[str, Any], version: str = "content/2") -> tuple[str, str]:
    """Stable SHA-256 hex digest of a record under a versioned rule: ``(digest, version)``.

    Raises ``ValueError`` (a ``RecordError``) when the record cannot be hashed under
    that rule, for example a float price under ``content/2``.
    """
    return hash_rule(version).digest(canonical_fields(record)), version


def compute_hashes(fields: Mapping[str, Any], versions: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Digest per version of canonical fields, and the reason per version that could not be computed."""
    digests: dict[str, str] = {}
    errors: dict[str, str] = {}
    for version in versions:
        try:
            digests[version] = hash_rule(version).digest(fields)
        except RecordError as exc:
            errors[version] = str(exc)
    return digests, errors
