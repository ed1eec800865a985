"""URL canonicalisation, versions ``url/1`` and ``url/2``.

Two URLs that differ only in ways a web server cannot observe (or in
advertising/analytics tracking parameters) get the same canonical string;
two URLs that could address different content never do.  Nothing lossy:
path case, trailing slashes, ``+`` versus ``%20``, ``%2F`` versus ``/`` and
``a`` versus ``a=`` in queries are all preserved.

Rules of ``url/1`` (changing any of them means bumping :data:`URL_VERSION`):

* surrounding whitespace stripped, Unicode whitespace included (as
  ``str.strip``: a scraped link's trailing no-break space is an artefact of
  text extraction, not part of the address); embedded tab, CR and LF removed
  (as browsers do);
* only ``http`` and ``https`` are canonicalised; the scheme is lowercased;
* the host is lowercased; a non-ASCII host is converted to punycode with
  IDNA 2008 / UTS #46 non-transitional processing (what browsers do, so
  ``faß.de`` and ``fass.de`` stay distinct); IPv6 literals keep their
  brackets and are lowercased (not compressed); a trailing dot is kept;
  userinfo is kept as written, except that characters RFC 3986 does not
  allow in it (space, controls, ``@``, non-ASCII, ...) are percent-encoded
  as UTF-8, so the result is always a valid URL.  Other hosts must be RFC 3986
  registered names (letters, digits, ``-._~!$&'()*+,;=``); percent-encoded
  hosts are refused rather than guessed at;
* the default port (80 for http, 443 for https) and an empty port are
  dropped; other ports are written without leading zeros;
* an empty path becomes ``/``; dot segments are removed (RFC 3986 5.2.4);
  case and trailing slashes are kept;
* percent-encoding is normalised (RFC 3986 6.2.2): hex digits uppercased and
  escapes of unreserved characters (``A-Z a-z 0-9 - . _ ~``) decoded.
  Characters RFC 3986 does not allow in the path or query (space, controls,
  ``"<>[\\]^`{|}``, non-ASCII, a ``%`` that does not start an escape) are
  percent-encoded as UTF-8.  Nothing else is decoded or encoded;
* the query is split on ``&``; empty pieces and tracking parameters (see
  :data:`TRACKING_PARAMS` and :data:`TRACKING_PREFIXES`) are dropped, the
  rest sorted by (name, value); an empty query loses its ``?``;
* the fragment is dropped.

Rules of ``url/2`` (the default): those of ``url/1``, and

* userinfo (``user:password@``) is dropped: credentials are not the
  resource's identity, and must never be stored (``nothing lossy`` is about
  the resource);
* IPv6 literals are written in their RFC 5952 form: lowercase, leading zeros
  dropped, the longest run of zero groups compressed (``[::0:1]`` is
  ``[::1]``, ``[2001:0DB8:0:0:0:0:0:1]`` is ``[2001:db8::1]``), an
  IPv4-mapped address with its IPv4 part dotted (``[::ffff:192.0.2.1]``).

:func:`without_userinfo` drops the userinfo of URL text, for callers that
must not keep credentials whatever the version (the ladder, before it
canonicalises a record's URL under either version).

:func:`canonical_url` with ``strict=True`` raises :class:`UrlError` with the
reason (never the URL) when a rule cannot be applied: another scheme, no "//"
or no host, a bad port, an invalid host, a lone surrogate; by default it never
raises and then returns the stripped input. It is pure (no I/O) and idempotent.
"""

from __future__ import annotations

import ipaddress
import re

import idna

__all__ = [
    "TRACKING_PARAMS",
    "TRACKING_PREFIXES",
    "URL_VERSION",
    "URL_VERSIONS",
    "UrlError",
    "canonical_url",
    "userinfo_redacted",
    "without_userinfo",
]

#: The version `canonical_url` applies by default, and a new warehouse's.
URL_VERSION = "url/2"
#: Every version this code can apply; a version is never removed (stored keys and tombstones name it).
URL_VERSIONS = ("url/1", "url/2")

#: Query parameter names (compared case-insensitively) that only carry
#: click/campaign attribution, never the identity of the content.  Each is
#: set by an ad or analytics platform on links it rewrites, plus ``ref``,
#: which the project's spec (and the seeds) strip as a referral tag although a
#: few sites select content with it (GitHub's ``?ref=<branch>``): use a natural
#: key other than the URL for such sites.  Deliberately absent because some
#: sites use them to select content: ``source``, ``campaign``, ``cid``, ``si``,
#: ``spm``, ``tag`` and Matomo's ``pk_*``/``mtm_*`` family.
TRACKING_PARAMS: frozenset[str] = frozenset(
    {
        # Google Ads / Marketing Platform / Merchant Center
        "gclid",
        "gclsrc",
        "dclid",
        "gbraid",
        "wbraid",
        "gad_source",
        "srsltid",
        # Google Analytics cross-domain linker
        "_ga",
        "_gl",
        # Meta (Facebook, Instagram)
        "fbclid",
        "igshid",
        # Microsoft Advertising
        "msclkid",
        # Yandex
        "yclid",
        "ysclid",
        # Referral tag (url/1 spec)
        "ref",
        # X/Twitter, TikTok, LinkedIn, Pinterest
        "twclid",
        "ttclid",
        "li_fat_id",
        "epik",
        # Mailchimp
        "mc_cid",
        "mc_eid",
        # HubSpot
        "_hsenc",
        "_hsmi",
        "__hssc",
        "__hstc",
        "__hsfp",
        # Marketo, Klaviyo, Omeda, Vero
        "mkt_tok",
        "_kx",
        "oly_anon_id",
        "oly_enc_id",
        "vero_id",
        "vero_conv",
        # Affiliate networks (Impact, Rakuten Advertising)
        "irclickid",
        "ranmid",
        "raneaid",
        "ransiteid",
    }
)

#: Parameters whose lowercased name starts with one of these are dropped
#: (``utm_source``, ``utm_medium``, ``UTM_Campaign``, ...).
TRACKING_PREFIXES: tuple[str, ...] = ("utm_",)


class UrlError(ValueError):
    """The URL cannot be canonicalised.

    The message is the reason only; it never contains the URL, which may be
    personal data.
    """


# --- character classes (RFC 3986 sections 2 and 3) -------------------------

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_SUB_DELIMS = re.escape("!$&'()*+,;=")
_PATH_CHARS = r"A-Za-z0-9\-._~" + _SUB_DELIMS + ":@/"
_QUERY_CHARS = _PATH_CHARS + r"?"
# The tail of an escape already in normal form: uppercase hex digits, of a
# byte that is not unreserved (so not 2D 2E 30-39 41-5A 5F 61-7A 7E).
_NORMAL_ESCAPE_TAIL = r"(?:[0189A-F][0-9A-F]|2[0-9A-CF]|3[A-F]|[46]0|5[B-E]|7[B-DF])"

# Splits a URL with an http(s) scheme and a plain ASCII host (letters,
# digits, "-", "."; optional port) in one match; other URLs do not match.
# Groups: scheme, host, port (None if no ":"), path, path_rest, query,
# query_rest.  path (None if no "/") and query (None if no "?") stop at the
# first character that needs escape work; the *_rest groups hold the
# remainder, "" when the component is already normal.  What follows "#" is
# the fragment, ignored.  Possessive quantifiers: no backtracking.
_SPLIT_COMMON = re.compile(
    r"([Hh][Tt][Tt][Pp][Ss]?)://([A-Za-z0-9.\-]++)(?::([0-9]*+))?+"
    rf"(?:(/[{_PATH_CHARS}]*+(?:%{_NORMAL_ESCAPE_TAIL}[{_PATH_CHARS}]*+)*+)([^?#]*+))?+"
    r"(?![^?#])"
    rf"(?:\?([{_QUERY_CHARS}]*+(?:%{_NORMAL_ESCAPE_TAIL}[{_QUERY_CHARS}]*+)*+)([^#]*+))?+"
).match

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*").fullmatch
_REG_NAME = re.compile(r"[a-z0-9\-._~" + _SUB_DELIMS + r"]+").fullmatch
_IPV6_CHARS = re.compile(r"[0-9a-f:.]+").fullmatch
# A "%" that is not already a normal escape: a lowercase or unreserved
# escape, or a stray "%".  Then runs of characters that must be encoded.
_FIX_ESCAPES = re.compile(rf"%(?!{_NORMAL_ESCAPE_TAIL})(?:[0-9A-Fa-f]{{2}})?").sub
_ENCODE_IN_PATH = re.compile(f"[^{_PATH_CHARS}%]+").sub
_ENCODE_IN_QUERY = re.compile(f"[^{_QUERY_CHARS}%]+").sub
_ENCODE_IN_USERINFO = re.compile(rf"[^A-Za-z0-9\-._~{_SUB_DELIMS}:%]+").sub

_DROP_TAB_CR_LF = str.maketrans("", "", "\t\r\n")
_DEFAULT_PORT = {"http": "80", "https": "443"}
_MAX_IDN_LENGTH = 1024  # Unicode host chars; far above DNS's 253, bounds the IDNA work

# Schemes named in error messages; any other "scheme" might be the start of
# a typo'd "user:password" and is not echoed.
_KNOWN_SCHEMES = frozenset(
    "about blob data file ftp ftps git intent irc javascript magnet mailto "
    "news nntp sftp sms ssh tel urn vbscript webcal ws wss".split()
)


def _build_escape_tables() -> tuple[dict[str, str], list[str]]:
    """Return (any-case escape -> normal form, byte -> "%XX")."""
    byte_escape = [f"%{b:02X}" for b in range(256)]
    normal = {}
    for b in range(256):
        hi, lo = f"{b:02X}"
        target = chr(b) if chr(b) in _UNRESERVED else f"%{hi}{lo}"
        for h in {hi, hi.lower()}:
            for low in {lo, lo.lower()}:
                normal[f"%{h}{low}"] = target
    return normal, byte_escape


_ESCAPE_TO_NORMAL, _BYTE_TO_ESCAPE = _build_escape_tables()


# --- public API --------------------------------------------------------------


def canonical_url(url: str, strict: bool = False, version: str = URL_VERSION) -> str:
    """Return the canonical form of *url* under *version* (``url/2`` by default; ``url/1``).

    When a rule cannot be applied (not http(s), bad port, invalid host, ...),
    ``strict=True`` raises :class:`UrlError` with the reason (never the URL);
    the default returns *url* with surrounding whitespace stripped instead
    (under ``url/2`` without its userinfo), never raising on a str, so the
    result is always usable as a key and the function is idempotent. An
    unknown version is a ``ValueError`` even then, and anything but a str a
    ``TypeError``.
    """
    if not isinstance(url, str):
        raise TypeError(f"canonical_url takes a str, got {type(url).__name__}")
    if version not in URL_VERSIONS:
        raise ValueError(f"unknown URL version {version!r}; known: {list(URL_VERSIONS)}")
    v2 = version == "url/2"
    if strict:
        return _canonicalise(url, v2)
    try:
        return _canonicalise(url, v2)
    except ValueError:  # UrlError; ValueError as a belt-and-braces guarantee
        return without_userinfo(url.strip()) if v2 else url.strip()


def without_userinfo(url: str) -> str:
    """*url* without the userinfo of its authority (``https://u:p@h/x`` -> ``https://h/x``); other text unchanged.

    The authority is what follows the first ``//`` after the scheme's colon, up
    to the first ``/``, ``?``, ``#`` or backslash; its userinfo is everything
    up to its last ``@``.
    """
    if "@" not in url:
        return url
    start = url.find("//")
    if start < 0:
        return url
    start += 2
    end = start
    while end < len(url) and url[end] not in "/?#\\":
        end += 1
    at = url.rfind("@", start, end)
    return url if at < 0 else url[:start] + url[at + 1 :]


# The userinfo of an http(s) URL in raw text (a quarantined line that may not parse): after "://" (or JSON's
# ":\/\/", or its ":" and "/" written as \u escapes), a run of characters no URL delimiter or JSON string end,
# JSON's \uXXXX escapes included (but those of "/", "?" and "#", which end it), up to its last "@" (or "\u0040").
_USERINFO_IN_TEXT = re.compile(
    rb"(https?(?::|\\u003a)(?:\\?/|\\u002f){2})"
    rb"(?:[^\s/?#\"'<>\\]|\\u(?!002f|003f|0023)[0-9a-f]{4})*(?:@|\\u0040)",
    re.IGNORECASE,
)


def userinfo_redacted(raw: bytes) -> bytes:
    """*raw* (a line of text, any encoding that is ASCII-compatible) with the userinfo of every http(s) URL dropped."""
    return _USERINFO_IN_TEXT.sub(rb"\1", raw) if b"@" in raw or b"u0040" in raw else raw


def _canonicalise(url: str, v2: bool) -> str:
    """Return the canonical form of *url* or raise :class:`UrlError` (`canonical_url`, strict).

    See the module docstring for the rules.  Most URLs are split and checked
    by one regex match (:data:`_SPLIT_COMMON`) and only need their host
    lowercased and their query filtered and sorted; the others go through
    the general code, component by component.
    """
    s = url.strip()
    if "\t" in s or "\n" in s or "\r" in s:
        s = s.translate(_DROP_TAB_CR_LF)
    m = _SPLIT_COMMON(s)
    if m is None:
        scheme, authority, path, query = _canonical_parts(s, v2)
    else:
        scheme, host, port, path, path_rest, query, query_rest = m.groups()
        if scheme != "https" and scheme != "http":
            scheme = scheme.lower()
        authority = host.lower()
        if port is not None:
            port = _canonical_port(port, scheme)
            if port:
                authority = f"{authority}:{port}"
        if path_rest:  # the clean start of the path needs no second look
            path = _canonical_path(path_rest, path)
        elif not path:
            path = "/"
        elif "/." in path:
            path = _remove_dot_segments(path)
        if query_rest:
            query = _canonical_query(query_rest, query)
        elif query:
            query = _filter_and_sort(query)
    if query:
        return f"{scheme}://{authority}{path}?{query}"
    return f"{scheme}://{authority}{path}"


# --- general path ------------------------------------------------------------


def _canonical_parts(s: str, v2: bool) -> tuple[str, str, str, str]:
    """Return canonical (scheme, authority, path, query) of any URL text (under url/2 if *v2*).

    *s* is already stripped and free of tab/CR/LF.
    """
    scheme, start = _scheme_and_authority_start(s)
    end = s.find("#", start)
    if end < 0:
        end = len(s)
    question = s.find("?", start, end)
    if question < 0:
        question = end
    slash = s.find("/", start, question)
    if slash < 0:
        slash = question
    return (
        scheme,
        _canonical_authority(s[start:slash], scheme, v2),
        _canonical_path(s[slash:question]),
        _canonical_query(s[question + 1 : end]),
    )


def _reject_lone_surrogates(s: str) -> None:
    """Raise UrlError if *s* holds a lone surrogate (cannot be UTF-8).

    Checked where text is kept or encoded (userinfo, path, query); the host
    goes through IDNA, which rejects them, and the fragment is dropped.
    """
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise UrlError("lone surrogate (not valid Unicode text)") from None


def _scheme_and_authority_start(s: str) -> tuple[str, int]:
    """Return (lowercased scheme, index after its "//") or raise UrlError."""
    colon = s.find(":")
    scheme = s[:colon] if colon > 0 else ""
    if not _SCHEME(scheme):
        if s and not s[0].isprintable():  # a zero-width space or byte-order mark pasted in front: say so
            raise UrlError(f"no scheme: the URL starts with an invisible character (U+{ord(s[0]):04X})")
        raise UrlError("no scheme")
    lowered = scheme.lower()
    if lowered != "http" and lowered != "https":
        if lowered in _KNOWN_SCHEMES:
            raise UrlError(f"scheme {lowered!r} is not http(s)")
        raise UrlError("scheme is not http(s)")
    if s[colon + 1 : colon + 3] != "//":
        raise UrlError("no '//' after the scheme")
    return lowered, colon + 3


def _canonical_authority(authority: str, scheme: str, v2: bool) -> str:
    """Return ``[userinfo@]host[:port]`` in canonical form (url/2: ``host[:port]``)."""
    userinfo, at, hostport = authority.rpartition("@")
    if v2:
        userinfo = at = ""
    elif userinfo:
        userinfo = _ENCODE_IN_USERINFO(_encode_run, userinfo)
    if hostport.startswith("["):
        end = hostport.find("]") + 1
        if end == 0:
            raise UrlError("unterminated IPv6 literal")
        host = _canonical_ipv6(hostport[:end], v2)
        rest = hostport[end:]
        if rest and rest[0] != ":":
            raise UrlError("unexpected characters after IPv6 literal")
        port = rest[1:]
    else:
        host, _, port = hostport.partition(":")
        host = _canonical_host(host)
    port = _canonical_port(port, scheme)
    if port:
        return f"{userinfo}{at}{host}:{port}"
    return f"{userinfo}{at}{host}"


def _canonical_host(host: str) -> str:
    """Lowercase a registered name, converting Unicode labels to punycode."""
    if not host.isascii():
        if len(host) > _MAX_IDN_LENGTH:
            raise UrlError("host too long")
        host = ".".join([_idna_label(label) for label in host.split(".")])
    lowered = host.lower()
    if _REG_NAME(lowered):
        return lowered
    if not host:
        raise UrlError("no host")
    if "%" in host:
        raise UrlError("percent-encoded host")
    raise UrlError("invalid character in host")


def _idna_label(label: str) -> str:
    """Return an ASCII label unchanged, or a Unicode one as punycode.

    UTS #46 non-transitional mapping then IDNA 2008 (the ``idna`` package).
    Converting label by label keeps ASCII labels under the same rules as in
    an all-ASCII host, and saves the cost of the ``idna`` checks on them.
    """
    if label.isascii():
        return label
    try:
        return idna.encode(label, uts46=True).decode("ascii")
    except (idna.IDNAError, UnicodeError):
        raise UrlError("host is not a valid internationalised domain name") from None


def _canonical_ipv6(literal: str, v2: bool) -> str:
    """Validate a bracketed IPv6 literal; lowercase it (url/1), or write it in RFC 5952 form (url/2)."""
    inner = literal[1:-1].lower()
    if not _IPV6_CHARS(inner):
        raise UrlError("invalid IPv6 literal")
    try:
        address = ipaddress.IPv6Address(inner)
    except ValueError:
        raise UrlError("invalid IPv6 literal") from None
    if not v2:
        return f"[{inner}]"
    if address.ipv4_mapped is not None:  # spelled out: str() of these changed in Python 3.13
        return f"[::ffff:{address.ipv4_mapped}]"
    return f"[{address.compressed}]"


def _canonical_port(port: str, scheme: str) -> str:
    """Return the port without leading zeros, or "" for an empty/default one."""
    if not port or port == _DEFAULT_PORT[scheme]:
        return ""
    if not (port.isascii() and port.isdigit()):
        raise UrlError("port is not a number")
    digits = port.lstrip("0") or "0"
    if len(digits) > 5 or int(digits) > 65535:
        raise UrlError("port out of range")
    return "" if digits == _DEFAULT_PORT[scheme] else digits


def _canonical_path(path: str, normal_start: str | None = None) -> str:
    """Normalise escapes, encode what must be, remove dot segments.

    The canonical path is *normal_start* (already normal, or None) followed
    by *path*; it is "" or starts with "/" (it follows the authority).
    """
    path = _ENCODE_IN_PATH(_encode_run, _FIX_ESCAPES(_fix_escape, path))
    if normal_start:
        path = normal_start + path
    if not path:
        return "/"
    if "/." in path:
        path = _remove_dot_segments(path)
    return path


def _canonical_query(query: str, normal_start: str | None = None) -> str:
    """Normalise the query, drop empty and tracking pieces, sort the rest.

    The query is *normal_start* (already normal, or None) followed by *query*.
    """
    query = _ENCODE_IN_QUERY(_encode_run, _FIX_ESCAPES(_fix_escape, query))
    if normal_start:
        query = normal_start + query
    return _filter_and_sort(query) if query else ""


# --- shared steps ------------------------------------------------------------


def _filter_and_sort(query: str) -> str:
    """Drop empty and tracking pieces of a normalised query, sort the rest."""
    kept = []
    for piece in query.split("&"):
        # Escapes of unreserved characters are already decoded, so a name
        # that still holds a "%" cannot be a tracking name: testing the
        # normalised name is the same as testing the percent-decoded one.
        name = piece.partition("=")[0].lower()
        if name not in TRACKING_PARAMS and not name.startswith(TRACKING_PREFIXES) and piece:
            # A normalised query holds no NUL, so "\0" in place of the first
            # "=" sorts below any name character: plain string order is then
            # the (name, value) order, a bare "a" before "a=...".
            kept.append(piece.replace("=", "\0", 1))
    kept.sort()
    return "&".join(kept).replace("\0", "=")


def _fix_escape(match: re.Match[str]) -> str:
    """Normalise one escape ("%7e" -> "~", "%c3" -> "%C3"); a stray "%" -> "%25"."""
    return _ESCAPE_TO_NORMAL.get(match.group(), "%25")


def _encode_run(match: re.Match[str]) -> str:
    """Percent-encode a run of characters as UTF-8."""
    text = match.group()
    if not text.isascii():
        _reject_lone_surrogates(text)
    return "".join([_BYTE_TO_ESCAPE[b] for b in text.encode("utf-8")])


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4 for an absolute path (one starting with "/")."""
    segments = path.split("/")
    out: list[str] = []
    for segment in segments[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    if segments[-1] in (".", ".."):
        out.append("")  # "/a/b/.." -> "/a/", not "/a"
    return "/" + "/".join(out)
