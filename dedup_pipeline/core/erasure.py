"""Erasure subjects and their keyed fingerprints (tombstones). Pure: no I/O.

A tombstone is an HMAC-SHA256, under a secret key, of one identifier of an
erased subject. Without the key nobody can test a guess against it, unlike a
bare hash. Each fingerprint covers ``tombstone/1``, the identifier's kind,
its scope and its normalised value, so a natural key never matches a field
value that happens to be the same text:

==================  ============================  ====================================
kind                scope                         value
==================  ============================  ====================================
``natural_key``     ``""``                        the natural key as stored (a URL key in the
                                                  warehouse's URL version, ``url/2`` by default)
``canonical_url``   the URL version (``url/2``)   the canonical URL, so every URL variant matches
``field``           the field path (``seller_id``, the field's text (NFC, whitespace
                    ``author.email``)             collapsed, like the stored payload); a list
                                                  field: the text of each element (`field_texts`)
``content_digest``  the hash version              the lowercase hex digest
==================  ============================  ====================================

Ingestion computes the same fingerprints for every incoming record and asks
the warehouse whether any of them is a tombstone (`record_fingerprints`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from typing import Any

from dedup_pipeline.core.errors import RecordError
from dedup_pipeline.core.fields import canonical_fields, normalise_text
from dedup_pipeline.core.hashing import HASH_RULES, compute_hashes
from dedup_pipeline.core.numbers import plain_decimal
from dedup_pipeline.core.url import URL_VERSION, URL_VERSIONS, UrlError, canonical_url

TOMBSTONE_VERSION = "tombstone/1"
#: Fields the pipeline treats as personal data (documentation, the privacy test and
#: docs/privacy.md). Erasure accepts any field path; these are the ones a subject is usually named by.
PERSONAL_FIELDS = (
    "seller_id",
    "seller_name",
    "seller_email",
    "seller_phone",
    "author",
    "author_name",
    "author_email",
    "name",
    "email",
    "phone",
    "contact",
    "address",
    "username",
    "profile_url",
)

_FIELD_PATH = re.compile(r"[A-Za-z0-9_\-]{1,64}(?:\.[A-Za-z0-9_\-]{1,64}){0,7}")
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


class SubjectKind(str, Enum):
    """How an erasure request names its data subject."""

    NATURAL_KEY = "natural_key"
    CANONICAL_URL = "canonical_url"
    FIELD = "field"
    CONTENT_DIGEST = "content_digest"


_KEY, _URL, _FIELD, _DIGEST = (kind.value for kind in SubjectKind)


class SubjectError(ValueError):
    """An erasure subject that cannot be used. The message never repeats the value."""


@dataclass(frozen=True)
class Subject:
    """A normalised erasure subject: build it with `Subject.parse`."""

    kind: SubjectKind
    value: str
    scope: str = ""  # field path, hash version or URL version, per kind

    @classmethod
    def parse(cls, kind: str, value: str, field: str | None = None, version: str | None = None) -> Subject:
        """Validate and normalise what an operator typed (UI run config or command line)."""
        try:
            kind = SubjectKind(kind)
        except ValueError:
            raise SubjectError(f"kind must be one of {[k.value for k in SubjectKind]}, got {kind!r}") from None
        if not isinstance(value, str) or not value.strip():
            raise SubjectError("the subject value is empty")
        # A field path or version on another kind is a mistyped kind: erasing it as given would erase another subject.
        if field and kind is not SubjectKind.FIELD:
            raise SubjectError(f"a field path goes with kind 'field', not {kind.value!r}")
        if version and kind is not SubjectKind.CONTENT_DIGEST:
            raise SubjectError(f"a hash version goes with kind 'content_digest', not {kind.value!r}")
        if kind is SubjectKind.NATURAL_KEY:
            return cls(kind, normalise_natural_key(value))
        if kind is SubjectKind.CANONICAL_URL:
            try:
                return cls(kind, canonical_url(value, strict=True), URL_VERSION)
            except UrlError as exc:
                raise SubjectError(f"not a usable http(s) URL: {exc}") from None
        if kind is SubjectKind.FIELD:
            if not field or not _FIELD_PATH.fullmatch(field):
                raise SubjectError("kind 'field' needs a field path such as seller_id or author.email")
            return cls(kind, normalise_field_value(value), field)
        digest = value.strip().lower()
        if not _HEX_DIGEST.fullmatch(digest):
            raise SubjectError("a content digest is 64 hex digits")
        if not version or version not in HASH_RULES:
            raise SubjectError(f"kind 'content_digest' needs a hash version, one of {sorted(HASH_RULES)}")
        return cls(kind, digest, version)

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.scope.split(".")) if self.kind is SubjectKind.FIELD else ()

    @property
    def identifiers(self) -> tuple[str, ...]:
        """The values that name this subject: a URL (as a URL or a URL natural key) under both schemes."""
        if self.kind in (SubjectKind.CANONICAL_URL, SubjectKind.NATURAL_KEY):
            return page_variants(self.value)
        return (self.value,)


def page_variants(url: str) -> tuple[str, ...]:
    """A canonical URL and its twins: under the other scheme, and with or without a trailing slash on its path.

    `url/1` keeps http and https, and `/a` and `/a/`, apart (dedup never
    merges them: a server may serve two pages), but for erasure they are one
    page: erasing one erases and tombstones every variant. The root path `/`
    has no slash-less twin.
    """
    variants = [url]
    for scheme, other in (("https://", "http://"), ("http://", "https://")):
        if url.startswith(scheme):
            variants.append(other + url[len(scheme) :])
            break
    for variant in list(variants):
        address, question, query = variant.partition("?")
        path_start = address.find("/", address.find("//") + 2) if "//" in address else -1
        if path_start < 0:  # not a URL: a natural key of another kind
            continue
        if address.endswith("/"):
            if len(address) - 1 > path_start:  # not the root "/"
                variants.append(address[:-1] + question + query)
        else:
            variants.append(address + "/" + question + query)
    return tuple(dict.fromkeys(variants))


def normalise_natural_key(value: str) -> str:
    """A natural key as the warehouse stores it: URL keys take their canonical form (no userinfo)."""
    value = value.strip()
    try:
        return canonical_url(value, strict=True)
    except UrlError:
        return value


def normalise_field_value(value: Any) -> str | None:
    """The text a scalar field value is fingerprinted by, or None for values that name nobody (objects, lists, null).

    A list is not one value: `field_texts` reads its elements.
    """
    if value is None or isinstance(value, (dict, list, tuple, bool)):
        return None
    if not isinstance(value, str):
        # Canonical payloads hold exact decimals as text and integers as numbers: both become their text.
        value = str(value)
    text = normalise_text(value)
    return text or None


def field_value(payload: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """The value at a dotted field path of a payload, or None."""
    value: Any = payload
    for name in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(name)
    return value


def field_texts(payload: Mapping[str, Any], path: str) -> frozenset[str]:
    """The texts a record's field at a dotted path names someone by: "the field's values".

    The field's own text, or, for a list (Scrapy's `getall()`: `"author": ["Jane Doe", "Bob Roe"]`), the
    text of each element that is a string or a number, normalised alike; elements that are lists or
    objects are not looked into, and a path does not go through a list. Tombstone fingerprints, the
    quarantine matcher and staged rows read a field with this; the warehouse search
    (`store.erasure._field_holds`) is its SQL twin.
    """
    value = field_value(payload, tuple(path.split(".")))
    items = value if isinstance(value, (list, tuple)) else (value,)
    return frozenset(text for text in map(normalise_field_value, items) if text is not None)


def key_id(key: bytes) -> str:
    """A short public name for a key, stored beside each tombstone: a changed key is detected, never silently used."""
    return hmac.new(key, b"dedup tombstone key id", hashlib.sha256).hexdigest()[:16]


def fingerprint(key: bytes, kind: str, scope: str, value: str) -> bytes:
    """HMAC-SHA256 of one identifier (32 bytes)."""
    message = "\x1f".join((TOMBSTONE_VERSION, kind, scope, value)).encode("utf-8")
    return hmac.digest(key, message, "sha256")


def subject_fingerprint(key: bytes, subject: Subject) -> bytes:
    return fingerprint(key, subject.kind.value, subject.scope, subject.value)


def natural_key_fingerprint(key: bytes, natural_key: str) -> bytes:
    return fingerprint(key, SubjectKind.NATURAL_KEY.value, "", natural_key)


def url_fingerprint(key: bytes, canonical: str, url_version: str = URL_VERSION) -> bytes:
    return fingerprint(key, SubjectKind.CANONICAL_URL.value, url_version, canonical)


def digest_fingerprint(key: bytes, version: str, hex_digest: str) -> bytes:
    return fingerprint(key, SubjectKind.CONTENT_DIGEST.value, version, hex_digest)


@dataclass(frozen=True)
class Catalogue:
    """What kinds of tombstones exist: field paths and hash versions to fingerprint incoming records by."""

    fields: frozenset[str] = frozenset()
    versions: frozenset[str] = frozenset()
    key_ids: frozenset[str] = frozenset()
    generation: object = None  # identifies the tombstone set: it changes whenever the set does
    url_versions: frozenset[str] = frozenset()
    natural_keys: bool = False

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, str, str]], generation: object = None) -> Catalogue:
        fields, versions, key_ids, url_versions, natural_keys = set(), set(), set(), set(), False
        for kind, scope, kid in rows:
            key_ids.add(kid)
            if kind == _FIELD:
                fields.add(scope)
            elif kind == _DIGEST:
                versions.add(scope)
            elif kind == _URL:
                url_versions.add(scope)
            elif kind == _KEY:
                natural_keys = True
        return cls(
            frozenset(fields),
            frozenset(versions),
            frozenset(key_ids),
            generation,
            frozenset(url_versions),
            natural_keys,
        )

    def __bool__(self) -> bool:
        return bool(self.key_ids)


def record_fingerprints(
    key: bytes,
    catalogue: Catalogue,
    natural_key: str,
    canonical: str,
    payload: Mapping[str, Any],
    hashes: Mapping[str, str],
) -> list[bytes]:
    """Every fingerprint an incoming record could match a tombstone by.

    Its natural key, its canonical URL, each tombstoned field it carries (each
    of a list's elements: `field_texts`), and
    its digest under every hash version that has tombstones. A version the
    record was not hashed under (the ladder's `hash_versions` left it out) is
    computed here from the canonical payload, so a digest tombstone holds
    whatever versions the ladder is configured to compute.
    """
    found = [fingerprint(key, _KEY, "", natural_key)] if catalogue.natural_keys else []
    # Without userinfo, a URL's url/1 and url/2 forms differ only in an IPv6 host: the record's URL, in the
    # warehouse's version, is looked up under every URL version with tombstones.
    found += [fingerprint(key, _URL, scope, canonical) for scope in catalogue.url_versions if scope in URL_VERSIONS]
    found += [fingerprint(key, _FIELD, path, text) for path in catalogue.fields for text in field_texts(payload, path)]
    missing = [v for v in catalogue.versions if v not in hashes and v in HASH_RULES]
    computed = compute_hashes(payload, missing)[0] if missing else {}
    for version in catalogue.versions:
        digest = hashes.get(version) or computed.get(version)
        if digest:
            found.append(fingerprint(key, _DIGEST, version, digest))
    return found


#: The `hash_errors` key that marks a staged line withheld because it names an erased subject: the canonical rung
#: stages such a line with none of its data (see `ladder.canonical`), and the exact rung decides it `erased`.
WITHHELD = "withheld"
#: The scope of tombstones that only keep quarantined lines out: the URLs and keys of every row an erasure
#: removed, whatever named it (a field or a digest subject too), since it removed their broken lines as well.
QUARANTINE_SCOPE = "quarantine"
#: A URL in free text, up to the first character no URL holds unescaped; and a complete JSON string literal.
_URL_IN_TEXT = re.compile(r"https?://[^\s\"'<>\\^`{|}]+", re.IGNORECASE)
_JSON_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\.)*"')


def searchable_prefix(raw: bytes) -> bytes:
    """The longest start of `raw` that is UTF-8 text without a NUL byte: all of a line an erasure can search.

    Quarantine keeps no more than this. A line in Latin-1, cp1252 or UTF-16 (whose ASCII is interleaved with
    NUL bytes) may name a subject in bytes no text search recognises, so those bytes are never stored.
    """
    nul = raw.find(b"\x00")
    head = raw if nul < 0 else raw[:nul]
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return head[: exc.start]
    return head


def raw_line_fingerprints(key: bytes, catalogue: Catalogue, raw: bytes) -> list[bytes]:
    """Every fingerprint a quarantined line could match a tombstone by, read as text (it may not parse).

    Each URL in it (canonicalised) by URL and as a natural key; each complete
    JSON string in it, and each number given to a member named as a
    tombstoned field path ends, as the value of that path (and strings as a
    natural key); and when it parses as an object, the value of every
    tombstoned field path and its digests under every version with
    tombstones. What `RawLineMatcher` cannot find in a line is not found here
    either (an identifier cut by a truncation).
    """
    text = raw.decode("utf-8", errors="replace")
    strings = _json_strings(text)
    urls = {canonical_url(url) for source in (text, *strings) for url in _URL_IN_TEXT.findall(source)}
    found = [fingerprint(key, _URL, scope, url) for url in urls for scope in catalogue.url_versions]
    if catalogue.natural_keys:
        found += [
            fingerprint(key, _KEY, scope, normalise_natural_key(value))
            for value in strings | urls
            if value.strip()
            for scope in ("", QUARANTINE_SCOPE)
        ]
    values = {normalise_field_value(value) for value in strings} - {None}
    found += [fingerprint(key, _FIELD, path, value) for path in catalogue.fields for value in values]
    found += [
        fingerprint(key, _FIELD, path, number) for path in catalogue.fields for number in _named_numbers(text, path)
    ]
    fields = _canonical_fields_of(text) if catalogue.fields or catalogue.versions else None
    if fields is not None:
        found += [
            fingerprint(key, _FIELD, path, value) for path in catalogue.fields for value in field_texts(fields, path)
        ]
        try:
            digests, _ = compute_hashes(fields, [v for v in catalogue.versions if v in HASH_RULES])
        except (RecordError, RecursionError):
            digests = {}
        found += [fingerprint(key, _DIGEST, version, digest) for version, digest in digests.items()]
    return found


def _canonical_fields_of(text: str) -> dict | None:
    """The `record/1` fields of a line that parses as an object (and canonicalises), else None."""
    record = _loads_object(text)
    if record is None:
        return None
    try:
        return canonical_fields(record)
    except Exception:  # noqa: BLE001 - a broken record is searched as text instead
        return None


#: A JSON number as the value of a named member: `"seller_id": 4711001`.
_NAMED_NUMBER = r'"{name}"\s*:\s*(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)(?![\d.eE])'


def _named_numbers(text: str, path: str) -> set[str]:
    """The numbers a line (parsed or not) gives the last member of a field path, in their `record/1` text."""
    pattern = _NAMED_NUMBER.format(name=re.escape(path.rsplit(".", 1)[-1]))
    found = set()
    for literal in re.findall(pattern, text):
        try:
            found.add(normalise_field_value(plain_decimal(Decimal(literal))))
        except (RecordError, ArithmeticError, ValueError):
            continue
    return found - {None}


def _json_strings(text: str) -> set[str]:
    """The decoded value of every complete JSON string literal in `text` (`"https:\\/\\/..."` is a URL).

    A literal whose escapes make a lone surrogate (`"\\ud800"`) is no text anyone can be named by (nor
    fingerprinted: it has no UTF-8 form); the raw text around it is searched as it is.
    """
    strings = set()
    for literal in _JSON_STRING.findall(text):
        try:
            value = json.loads(literal)
            value.encode("utf-8")
        except ValueError:  # UnicodeEncodeError is one
            continue
        strings.add(value)
    return strings


def payload_digests(payload: Mapping[str, Any]) -> dict[str, str]:
    """Digest of a stored (canonical) payload under every registered hash version that can hash it."""
    return compute_hashes(payload, HASH_RULES)[0]


# ---------------------------------------------------------------- quarantine

_URL_TAIL = r"(?![A-Za-z0-9._~%!$&'()*+,;=:@/\-])"


@dataclass
class RawLineMatcher:
    """Decides whether a quarantined raw line holds one of an erasure's identifiers.

    A line that parses as a JSON object is canonicalised like a record and
    matched exactly: canonical URL, natural key, field values, digests of
    every version. Any other line (malformed JSON, invalid UTF-8, truncated)
    is searched as text: URLs by host and path (case-insensitive, ending at a
    URL boundary, so ``/p/1`` does not match ``/p/10``), natural keys and field
    values as complete JSON strings, and field values that are numbers as the
    number given to a member named as the field path ends
    (``"seller_id": 4711001``). What cannot be matched: an identifier cut
    by the truncation, escaped in an unusual way (``\\u`` escapes inside a URL,
    other percent-encodings), or a content digest in a line that does not parse.
    """

    urls: set[str]
    natural_keys: set[str]
    fields: dict[str, set[str]]  # field path -> normalised values
    digests: dict[str, set[str]]  # version -> hex digests

    def __post_init__(self) -> None:
        patterns = [re.escape(_host_and_path(url).lower()) + _URL_TAIL for url in self.urls]
        patterns += [re.escape(key.lower()) + _URL_TAIL for key in self.natural_keys if _is_url(key)]
        self._url_pattern = re.compile("|".join(patterns)) if patterns else None
        tokens = {v for values in self.fields.values() for v in values}
        tokens |= {key for key in self.natural_keys if not _is_url(key)}
        self._tokens = {form for token in tokens for form in (json.dumps(token), json.dumps(token, ensure_ascii=False))}
        self._values = tokens

    def matches(self, raw: bytes) -> bool:
        text = raw.decode("utf-8", errors="replace")
        fields = _canonical_fields_of(text)
        if fields is not None and self._matches_fields(fields):
            return True
        strings = _json_strings(text)  # decoded: `\/` and other escapes read as what they stand for
        if self._url_pattern is not None and any(self._url_pattern.search(s.lower()) for s in (text, *strings)):
            return True
        if any(token in text for token in self._tokens):
            return True
        if any(normalise_field_value(s) in self._values for s in strings):
            return True
        return any(_named_numbers(text, path) & values for path, values in self.fields.items())

    def _matches_fields(self, fields: dict) -> bool:
        url = fields.get("url")
        if isinstance(url, str) and (url in self.urls or url in self.natural_keys):
            return True
        for path, values in self.fields.items():
            if field_texts(fields, path) & values:
                return True
        if any(isinstance(v, str) and v in self.natural_keys for v in fields.values()):
            return True
        wanted = {v for v, digests in self.digests.items() if digests}
        if wanted:
            digests, _ = compute_hashes(fields, wanted)
            return any(digest in self.digests[v] for v, digest in digests.items())
        return False


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def _host_and_path(url: str) -> str:
    rest = url.split("://", 1)[-1]
    return rest.split("?", 1)[0]


def _loads_object(text: str) -> dict | None:
    try:
        value = json.loads(text, parse_float=Decimal)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
