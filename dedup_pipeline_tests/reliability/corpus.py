"""A corpus of nasty landing lines, generated (never copied data), each with the fate it must meet.

Every case is one physical line of a batch file and says exactly what must
happen to it: either it is canonicalised and stored with a payload written out
here by hand (`Stored`), or it goes to quarantine at a given rung with a given
reason (`Quarantined`). `nasty_batch()` interleaves good and bad lines so that
every bad line has good neighbours.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

SHOP = "https://shop.example.com/nasty"
#: Emoji, a ZWJ family sequence, a flag and a skin tone: kept as they are.
EMOJI = "\U0001f469\u200d\U0001f469\u200d\U0001f467 \U0001f1eb\U0001f1f7 \U0001f44d\U0001f3fd \u2615\ufe0f"
VOLATILE = {
    "scraped_at": "2026-11-01T10:00:00Z",
    "crawl_id": "crawl-n",
    "proxy_ip": "10.1.2.3",
    "response_ms": 87,
    "etag": 'W/"e1"',
    "fetched_at": "2026-11-01T10:00:01Z",
    "request_id": "r-1",
    "user_agent": "bot/1.0",
}
MEGABYTE = 1 << 20


@dataclass(frozen=True)
class Stored:
    """The line is canonicalised; `payload` is exactly what `records` holds for it (None: an exact duplicate)."""

    payload: dict | None
    decision: str = "new"
    hash_errors: dict[str, str] = field(default_factory=dict)  # version -> reason kept in record_hashes.error


@dataclass(frozen=True)
class Quarantined:
    rung: str
    reason: str
    kept: bytes | None = None  # the raw bytes quarantine keeps, when not the whole line


#: How quarantine notes a line it keeps only up to where it stops being UTF-8 text.
_CUT = "; raw line kept up to byte {} of {}: the rest is not UTF-8 text (an erasure could not search it)"


def _bad_text(name: str, line: bytes, reason: str, kept: int) -> Case:
    """A line the raw rung quarantines that is not UTF-8 text throughout: only its first `kept` bytes are kept."""
    return Case(name, line, Quarantined("raw", reason + _CUT.format(kept, len(line)), line[:kept]))


@dataclass(frozen=True)
class Case:
    name: str
    line: bytes
    fate: Stored | Quarantined


def _dump(record: Any) -> bytes:
    """The record as one JSON line; a Decimal value is written as the JSON number of its text (`1E+4299`)."""
    numbers = {}

    def number(value):
        if not isinstance(value, Decimal):
            raise TypeError(type(value).__name__)
        numbers[f"decimal-{len(numbers)}"] = str(value)
        return f"decimal-{len(numbers) - 1}"

    text = json.dumps(record, ensure_ascii=False, default=number)
    for token, digits in numbers.items():
        text = text.replace(f'"{token}"', digits)
    return text.encode("utf-8")


def raw_listing(n: int | str, **fields) -> dict:
    """A scraped listing with every volatile field a crawler adds."""
    record = {
        "url": f"{SHOP}/{n}",
        "title": f"Nasty item {n}",
        "price": "1.50",
        "currency": "eur",
        "seller_id": "s-nasty",
        "sku": f"N-{n}",
        **VOLATILE,
    }
    record.update(fields)
    return {k: v for k, v in record.items() if v is not _DROP}


def stored_payload(n: int | str, **fields) -> dict:
    """The canonical payload of `raw_listing(n)` written out by hand (volatile fields gone, price exact text)."""
    payload = {
        "url": f"{SHOP}/{n}",
        "title": f"Nasty item {n}",
        "price": "1.5",
        "currency": "EUR",
        "seller_id": "s-nasty",
        "sku": f"N-{n}",
    }
    payload.update(fields)
    return {k: v for k, v in payload.items() if v is not _DROP}


_DROP = object()  # a field left out


def _good(name: str, n: int | str, raw: dict | None = None, stored: dict | None = None, **kw) -> Case:
    return Case(name, _dump(raw_listing(n, **(raw or {}))), Stored(stored_payload(n, **(stored or {})), **kw))


def _bad(name: str, line: bytes | dict, rung: str, reason: str) -> Case:
    return Case(name, line if isinstance(line, bytes) else _dump(line), Quarantined(rung, reason))


def _megabyte_text(seed: int) -> str:
    words = ("kettle", "steel", "copper", "lid", "spout", "handle", "enamel", "whistle")
    out, i, size = [], seed, 0
    while size < MEGABYTE:
        i = (i * 1103515245 + 12345) % (1 << 31)
        out.append(words[i % len(words)] + str(i % 997))
        size += len(out[-1]) + 1
    return " ".join(out)


V2_NEEDS_CURRENCY = "content/2: missing identity field 'currency'"
V2_MINOR_OUT_OF_RANGE = "price: out of range in minor units (more than 4300 digits)"
NESTING_TOO_DEEP = "nesting too deep (more than 100 levels of arrays and objects)"


def _nested(levels: int) -> list:
    """`levels` lists, one inside the next, around a 1 (a record holding it nests `levels` + 1 deep)."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def good_cases() -> list[Case]:
    """Lines that must be stored, with their exact canonical payloads."""
    big = _megabyte_text(7)
    sql = "Robert'); DROP TABLE records; -- 1 OR 1=1; SELECT * FROM pg_user"
    html = "<script>alert('x')</script><b onclick=\"steal()\">bold</b> &amp; &lt;/textarea&gt;"
    return [
        _good("plain listing", 1),
        _good(
            "combining characters (NFD) are stored NFC",
            2,
            raw={"title": "Cafe\u0301 cre\u0300me bru\u0302le\u0301e"},
            stored={"title": "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e"},
        ),
        _good(
            "decomposed Hangul jamo are composed",
            3,
            raw={"title": "\u1112\u1161\u11ab\u1100\u1173\u11af"},
            stored={"title": "\ud55c\uae00"},
        ),
        _good(
            "compatibility forms are not folded (NFC, not NFKC)",
            4,
            raw={"title": "\ufb01ne \uff26\uff55\uff4c\uff4c \u2460"},
            stored={"title": "\ufb01ne \uff26\uff55\uff4c\uff4c \u2460"},
        ),
        _good(
            "right-to-left text and direction marks are kept",
            5,
            raw={"title": "\u200f\u05de\u05d8\u05d1\u05d7 \u0645\u0637\u0628\u062e \u202eabc\u202c"},
            stored={"title": "\u200f\u05de\u05d8\u05d1\u05d7 \u0645\u0637\u0628\u062e \u202eabc\u202c"},
        ),
        _good(
            "emoji, ZWJ sequences, flags and skin tones are kept",
            6,
            raw={"title": EMOJI},
            stored={"title": EMOJI},
        ),
        _good(
            "whitespace runs of every kind collapse to one space",
            7,
            raw={"title": " \t Big\u00a0\u00a0 kettle\n\r\n \u2003 red\u3000 "},
            stored={"title": "Big kettle red"},
        ),
        _good("a megabyte-long field is stored whole", 8, raw={"description": big}, stored={"description": big}),
        _good(
            "text that looks like SQL is stored as text",
            9,
            raw={"title": sql, "sku": "x'; DROP TABLE quarantine;--"},
            stored={"title": sql, "sku": "x'; DROP TABLE quarantine;--"},
        ),
        _good("text that looks like HTML is stored unescaped", 10, raw={"title": html}, stored={"title": html}),
        Case(
            "SQL in the URL path keeps its characters",
            _dump(raw_listing(11, url=f"{SHOP}/11';DROP%20TABLE%20records;--")),
            Stored(stored_payload(11, url=f"{SHOP}/11';DROP%20TABLE%20records;--")),
        ),
        Case(
            "IDNA host becomes punycode, query sorted, tracking dropped",
            _dump(raw_listing(12, url="https://B\u00fccher.Example/katalog/12?b=2&utm_source=x&a=1")),
            Stored(stored_payload(12, url="https://xn--bcher-kva.example/katalog/12?a=1&b=2")),
        ),
        Case(
            "IPv6 literal host with a port",
            _dump(raw_listing(13, url="https://[2001:DB8::1]:8443/nasty/13")),
            Stored(stored_payload(13, url="https://[2001:db8::1]:8443/nasty/13")),
        ),
        Case(
            "default port, dot segments, fragment",
            _dump(raw_listing(14, url="HTTP://Shop.Example.COM:80/nasty/./x/../14?gclid=1#top")),
            Stored(stored_payload(14, url="http://shop.example.com/nasty/14")),
        ),
        Case(
            "non-ASCII path is percent-encoded as UTF-8",
            _dump(raw_listing(15, url=f"{SHOP}/caf\u00e9-15")),
            Stored(stored_payload(15, url=f"{SHOP}/caf%C3%A9-15")),
        ),
        Case(
            "path case is kept: a second row, not a merge",
            _dump(
                raw_listing(1, url=f"{SHOP}/1".upper().replace("HTTPS://SHOP.EXAMPLE.COM", "https://shop.example.com"))
            ),
            Stored(stored_payload(1, url="https://shop.example.com/NASTY/1")),
        ),
        Case(
            "JSON numbers are exact decimals, never floats",
            b'{"url": "' + f"{SHOP}/16".encode() + b'", "price": 9.90, "weight": 1.000000000000000000000000000001, '
            b'"count": 12345678901234567890123456789012345, "ratio": 1E+3, "tiny": -0.000, "currency": "eur"}',
            Stored(
                {
                    "url": f"{SHOP}/16",
                    "price": "9.9",
                    "weight": "1.000000000000000000000000000001",
                    "count": 12345678901234567890123456789012345,
                    "ratio": "1000",
                    "tiny": "0",
                    "currency": "EUR",
                },
                hash_errors={"content/2": "content/2: missing identity field 'title'"},
            ),
        ),
        _good(
            "numeric price strings become exact decimal text",
            17,
            raw={"price": " 0012.3400 "},
            stored={"price": "12.34"},
        ),
        _good(
            "a price that is not a number stays text",
            18,
            raw={"price": "call  for price"},
            stored={"price": "call for price"},
            hash_errors={"content/2": "price: not a decimal number"},
        ),
        _good(
            "wrong field types are kept as they are (content/1 hashes them)",
            19,
            raw={"title": 42, "price": True, "seller_id": ["a", " b  c "], "currency": None},
            stored={"title": 42, "price": True, "seller_id": ["a", "b c"], "currency": _DROP},
            hash_errors={"content/2": V2_NEEDS_CURRENCY},
        ),
        _good(
            "missing identity fields are fine for content/1",
            20,
            raw={"title": _DROP, "price": _DROP, "seller_id": _DROP},
            stored={"title": _DROP, "price": _DROP, "seller_id": _DROP},
            hash_errors={"content/2": "content/2: missing identity field 'title'"},
        ),
        _good(
            "nested extra fields are canonicalised and kept",
            21,
            raw={"specs": {"size": " L ", "tags": [" a  b ", None], "dims": {"w": 1.50, "skip": None}}},
            stored={"specs": {"size": "L", "tags": ["a b", None], "dims": {"w": "1.5"}}},
        ),
        Case(
            "escaped characters decode to the same text",
            b'{"url": "'
            + f"{SHOP}/23".encode()
            + b'", "title": "caf\\u00e9 \\ud83d\\ude00 \\"q\\" \\\\", "price": "1.50", "currency": "eur", '
            b'"seller_id": "s-nasty", "sku": "N-23"}',
            Stored(stored_payload(23, title='caf\u00e9 \U0001f600 "q" \\')),
        ),
        Case("CRLF line ending", _dump(raw_listing(24)) + b"\r", Stored(stored_payload(24))),
        Case(
            "userinfo (credentials, even ones a URL cannot hold: space, '@') is dropped, never stored",
            _dump(raw_listing(25, url="https://admin:hunter2@shop.example.com/nasty/25")),
            Stored(stored_payload(25)),
        ),
        Case(
            "a user name with '@', no-break space and controls is dropped too",
            _dump(raw_listing(26, url="https://u s@a\u00a0\x0b\x1f@shop.example.com/nasty/26")),
            Stored(stored_payload(26)),
        ),
        _good(
            "a timestamp outside years 1-9999 in UTC is no crawl time, not an error",
            27,
            raw={"scraped_at": "0001-01-01T00:00:00+01:00"},
        ),
        _good("the last representable timestamp, west of UTC", 28, raw={"scraped_at": "9999-12-31T23:59:59-01:00"}),
        _good(
            "a price too large in minor units: content/2 cannot hash it",
            29,
            raw={"price": Decimal("1e4299")},
            stored={"price": "1" + "0" * 4299},
            hash_errors={"content/2": V2_MINOR_OUT_OF_RANGE},
        ),
        _good(
            "the same as text",
            30,
            raw={"price": "1e4299"},
            stored={"price": "1" + "0" * 4299},
            hash_errors={"content/2": V2_MINOR_OUT_OF_RANGE},
        ),
        _good(
            "a 4300-digit price",
            31,
            raw={"price": int("9" * 4300)},
            stored={"price": int("9" * 4300)},
            hash_errors={"content/2": V2_MINOR_OUT_OF_RANGE},
        ),
        _good(
            "three-digit minor units push a price past the limit",
            32,
            raw={"price": Decimal("1e4298"), "currency": "KWD"},
            stored={"price": "1" + "0" * 4298, "currency": "KWD"},
            hash_errors={"content/2": V2_MINOR_OUT_OF_RANGE},
        ),
        _good(
            "a 4300-digit price in minor units is exact",
            33,
            raw={"price": _DROP, "price_minor": int("9" * 4300)},
            stored={"price": _DROP, "price_minor": int("9" * 4300)},
        ),
        _good("nesting at the limit is kept", 34, raw={"deep": _nested(99)}, stored={"deep": _nested(99)}),
        Case(
            "a re-crawl with other volatile fields is an exact duplicate",
            _dump(raw_listing(1, scraped_at="2026-12-24T00:00:00Z", crawl_id="other", etag="e9")),
            Stored(None, decision="exact_duplicate"),
        ),
    ]


def bad_cases() -> list[Case]:
    """Lines that must go to quarantine, with their rung and exact reason."""
    long_url = f"{SHOP}/" + "x" * 5000
    return [
        _bad(
            "malformed JSON: cut short",
            b'{"url": "https://shop.example.com/nasty/b1", "title": "brok',
            "raw",
            "malformed JSON: Unterminated string starting at column 55",
        ),
        _bad(
            "malformed JSON: trailing garbage",
            b'{"url": "https://shop.example.com/nasty/b2"} x',
            "raw",
            "malformed JSON: Extra data at column 46",
        ),
        _bad(
            "malformed JSON: single quotes",
            b"{'url': 'https://shop.example.com/nasty/b3'}",
            "raw",
            "malformed JSON: Expecting property name enclosed in double quotes at column 2",
        ),
        _bad(
            "a JSON array is not a record",
            b'[{"url": "https://shop.example.com/nasty/b4"}]',
            "raw",
            "a record must be a JSON object, got list",
        ),
        _bad(
            "a bare string is not a record",
            b'"https://shop.example.com/nasty/b5"',
            "raw",
            "a record must be a JSON object, got str",
        ),
        _bad("null is not a record", b"null", "raw", "a record must be a JSON object, got NoneType"),
        _bad_text(
            "invalid UTF-8 (a Latin-1 line)",
            '{"title": "caf\u00e9"}'.encode("latin-1"),
            "invalid UTF-8 at byte 14",
            14,
        ),
        _bad_text("invalid UTF-8 (overlong encoding)", b'{"title": "\xc0\xaf"}', "invalid UTF-8 at byte 11", 11),
        _bad_text("invalid UTF-8 (encoded surrogate)", b'{"title": "\xed\xa0\x80"}', "invalid UTF-8 at byte 11", 11),
        _bad_text(
            "a raw NUL byte inside a string",
            b'{"title": "a\x00b"}',
            "malformed JSON: Invalid control character at column 13",
            12,
        ),
        _bad(
            "an escaped NUL in a value",
            b'{"url": "https://shop.example.com/nasty/b6", "title": "a\\u0000b"}',
            "raw",
            "field 'title': NUL character in text",
        ),
        _bad(
            "an escaped NUL in a nested value",
            b'{"specs": {"tags": ["x\\u0000"]}}',
            "raw",
            "field 'specs': NUL character in text",
        ),
        _bad(
            "a lone surrogate in a value",
            b'{"title": "\\ud800 lone"}',
            "raw",
            "field 'title': lone surrogate in text (not valid Unicode)",
        ),
        _bad(
            "a lone surrogate in a key",
            b'{"\\udfff": 1}',
            "raw",
            "record key: lone surrogate in text (not valid Unicode)",
        ),
        _bad("NaN is not JSON", b'{"price": NaN}', "raw", "JSON constant NaN is not allowed"),
        _bad("Infinity is not JSON", b'{"price": -Infinity}', "raw", "JSON constant -Infinity is not allowed"),
        _bad(
            "an exponent too large to store exactly",
            b'{"url": "https://shop.example.com/nasty/b7", "price": 1e999999999}',
            "raw",
            "JSON number out of range (its exact text would exceed 4300 digits)",
        ),
        _bad(
            "an exponent too small to store exactly",
            b'{"url": "https://shop.example.com/nasty/b8", "w": 1e-999999999}',
            "raw",
            "JSON number out of range (its exact text would exceed 4300 digits)",
        ),
        _bad(
            "an integer longer than 4300 digits",
            b'{"count": ' + b"9" * 5000 + b"}",
            "raw",
            "JSON number out of range (its exact text would exceed 4300 digits)",
        ),
        _bad("nesting too deep for the JSON parser", b"[" * 200_000, "raw", NESTING_TOO_DEEP),
        _bad(
            "valid JSON nested past the limit (the Python stack would still hold it)",
            raw_listing("b9", deep=_nested(100)),
            "raw",
            NESTING_TOO_DEEP,
        ),
        _bad(
            "valid JSON nested deeper than canonicalising could recurse",
            raw_listing("b10", deep=_nested(600)),
            "raw",
            NESTING_TOO_DEEP,
        ),
        _bad(
            "a byte-order mark inside the file",
            b"\xef\xbb\xbf" + _dump(raw_listing("bom")),
            "raw",
            "malformed JSON: a byte-order mark starts the line (only the file's first line may have one) at column 1",
        ),
        Case(
            "duplicate JSON keys: which value is meant is unknown",
            b'{"url": "' + f"{SHOP}/22".encode() + b'", "title": "first", "title": "second", "price": "1.50", '
            b'"currency": "eur", "seller_id": "s-nasty", "sku": "N-22"}',
            Quarantined("raw", 'duplicate key "title" in a JSON object (which of its values is meant is unknown)'),
        ),
        _bad("no url", raw_listing("c1", url=_DROP), "canonical", "missing url"),
        _bad("a url that is a number", raw_listing("c15", url=123), "canonical", "url must be text, got int"),
        _bad(
            "a url that is a list", raw_listing("c16", url=[f"{SHOP}/c16"]), "canonical", "url must be text, got list"
        ),
        _bad("an empty url", raw_listing("c2", url="   "), "canonical", "missing url"),
        _bad(
            "a javascript: url",
            raw_listing("c3", url="javascript:alert(document.cookie)"),
            "canonical",
            "invalid url: scheme 'javascript' is not http(s)",
        ),
        _bad(
            "a mailto: url",
            raw_listing("c4", url="mailto:someone@example.com"),
            "canonical",
            "invalid url: scheme 'mailto' is not http(s)",
        ),
        _bad("a relative url", raw_listing("c5", url="/nasty/c5"), "canonical", "invalid url: no scheme"),
        _bad("a url without a host", raw_listing("c6", url="https:///nasty/c6"), "canonical", "invalid url: no host"),
        _bad(
            "a port out of range",
            raw_listing("c7", url="https://shop.example.com:99999/nasty/c7"),
            "canonical",
            "invalid url: port out of range",
        ),
        _bad(
            "a port that is not a number",
            raw_listing("c8", url="https://shop.example.com:8o8o/nasty/c8"),
            "canonical",
            "invalid url: port is not a number",
        ),
        _bad(
            "an unterminated IPv6 literal",
            raw_listing("c9", url="https://[2001:db8::1/nasty/c9"),
            "canonical",
            "invalid url: unterminated IPv6 literal",
        ),
        _bad(
            "an invalid IPv6 literal",
            raw_listing("c10", url="https://[2001:db8::g]/nasty/c10"),
            "canonical",
            "invalid url: invalid IPv6 literal",
        ),
        _bad(
            "an emoji host is not a valid IDNA name",
            raw_listing("c11", url="https://\U0001f4a9.example/nasty/c11"),
            "canonical",
            "invalid url: host is not a valid internationalised domain name",
        ),
        _bad(
            "a percent-encoded host",
            raw_listing("c12", url="https://sh%6Fp.example.com/nasty/c12"),
            "canonical",
            "invalid url: percent-encoded host",
        ),
        _bad(
            "a space in the host",
            raw_listing("c13", url="https://shop example.com/nasty/c13"),
            "canonical",
            "invalid url: invalid character in host",
        ),
        _bad(
            "a natural key too long for a unique index",
            raw_listing("c14", url=long_url),
            "canonical",
            "natural key too long (5031 bytes; at most 2048)",
        ),
    ]


def nasty_cases() -> list[Case]:
    """Good and bad cases interleaved: every bad line sits between good ones."""
    good, bad = good_cases(), bad_cases()
    out: list[Case] = []
    for i in range(max(len(good), len(bad))):
        if i < len(bad):
            out.append(bad[i])
        if i < len(good):
            out.append(good[i])
    return out


def batch_bytes(cases: list[Case]) -> bytes:
    """The batch file: one line per case, blank lines between a few (skipped, but they count in line numbers)."""
    parts = []
    for i, case in enumerate(cases):
        parts.append(case.line + b"\n")
        if i % 7 == 3:
            parts.append(b"  \n")
    return b"".join(parts)


def line_numbers(cases: list[Case]) -> dict[int, Case]:
    """Physical line number (1-based, blank lines counted) of each case in `batch_bytes(cases)`."""
    out, line = {}, 0
    for i, case in enumerate(cases):
        line += 1
        out[line] = case
        if i % 7 == 3:
            line += 1
    return out
