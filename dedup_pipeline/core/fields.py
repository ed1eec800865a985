"""`record/1`: the canonical form of a record's fields, stored as the payload and fed to every hash rule.

Volatile fetch metadata and nulls are left out; text is NFC with whitespace
collapsed; currency codes are upper case; exact decimals (JSON numbers are
read as Decimal) and numeric price strings become plain decimal text
(" 9.90 " -> "9.9"); the URL takes its `url/1` form (the ladder then writes an IPv6 host in the warehouse's
URL version: `records.identity_url`). The form is idempotent,
so hashing a stored payload gives the digest its raw record had: the rehash
job relies on that. Changing this form changes every digest, so it is a new
`record/N` and new hash versions, never an edit in place.

`dedup_pipeline.core.canonical` gives the same form for a chunk of records at once,
column-wise; this module is its specification (its tests compare the two).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.numbers import parse_decimal, plain_decimal
from dedup_pipeline.core.url import canonical_url, without_userinfo

RECORD_VERSION = "record/1"
#: Fetch metadata that changes without the content changing. Never stored, never hashed.
VOLATILE_FIELDS = frozenset(
    {"scraped_at", "crawl_id", "proxy_ip", "response_ms", "etag", "fetched_at", "request_id", "user_agent"}
)
#: Fields whose numeric strings are read as numbers, so " 9.90 " equals 9.9.
NUMERIC_FIELDS = frozenset({"price", "price_minor"})
#: Fields whose text is case-insensitive codes.
UPPER_CASE_FIELDS = frozenset({"currency"})


def normalise_text(value: str) -> str:
    """NFC, surrounding whitespace stripped, inner whitespace runs collapsed to one space."""
    if not value.isascii():
        value = unicodedata.normalize("NFC", value)
    return " ".join(value.split())


def is_blank(value: Any) -> bool:
    """Whether a field counts as missing: absent (None) or text that is empty once normalised ("", "   ")."""
    return value is None or (isinstance(value, str) and not normalise_text(value))


def field_value(key: str, value: Any) -> Any:
    """One (non-URL) field's `record/1` form."""
    if isinstance(value, str):
        if key in NUMERIC_FIELDS:
            try:
                return plain_decimal(parse_decimal(value, key))
            except RecordError:
                pass  # "call for price" stays text
        text = normalise_text(value)
        return text.upper() if key in UPPER_CASE_FIELDS else text
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise RecordError(f"field '{key}': not a finite number")
        return plain_decimal(value)
    if isinstance(value, Mapping):
        return {str(k): field_value(str(k), v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [field_value(key, v) for v in value]
    return value  # int, bool; a float only reaches here from library callers, and rules decide about it


def record_url(url: str) -> str:
    """The `record/1` form of a URL: its `url/1` form without userinfo (credentials are never part of a record)."""
    return canonical_url(without_userinfo(url), version="url/1")


def canonical_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """The `record/1` form of a record (see the module docstring)."""
    fields = {}
    for key, value in record.items():
        if key in VOLATILE_FIELDS or value is None:
            continue
        if key == "url" and isinstance(value, str):
            fields[key] = record_url(value)
        else:
            fields[key] = field_value(key, value)
    return fields
