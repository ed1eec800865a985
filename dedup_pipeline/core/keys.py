"""Whether a secret key is good enough to key the erasure tombstones. Pure: no I/O.

A tombstone is only as secret as its key: with a guessable key anyone can
test a guessed identifier against the fingerprints. `key_weakness` refuses,
besides a key shorter than `MIN_KEY_BYTES`, a known placeholder (the text of
an example file left in place), and a key with little entropy: few distinct
characters, a low Shannon entropy per character, a short pattern repeated, or
a run of neighbouring characters (``abcdef…``, ``123456…``). A key from
`secrets.token_urlsafe(32)`, `secrets.token_hex(32)` or `openssl rand -hex 32`
passes every rule with a wide margin. The reason never contains the key.
"""

from __future__ import annotations

import math
from collections import Counter

#: A key shorter than this is refused: it could be guessed, and then so could every fingerprint.
MIN_KEY_BYTES = 32
#: The command an error tells the operator to run.
MAKE_A_KEY = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'
#: Words of example and placeholder values; compared with the key lowercased, letters and digits only. Six letters
#: or more, so a random key holds one by chance less than once in ten million.
PLACEHOLDER_WORDS = (
    "changeme",
    "replaceme",
    "placeholder",
    "example",
    "secret",
    "password",
    "passwd",
    "yourkey",
    "tombstonekey",
    "fillin",
    "default",
    "notreal",
)
#: Below these a key is refused. A random hex key has all 16 hex digits and about 3.8 bits per character;
#: a random URL-safe one about 40 distinct characters and 5 bits.
MIN_DISTINCT_CHARS = 10
MIN_BITS_PER_CHAR = 3.0
#: A key whose neighbouring characters are equal or one apart this often is a run ("abcdef...", "112233...").
MAX_RUN_SHARE = 0.5


def bits_per_char(key: str) -> float:
    """Shannon entropy of the key's character frequencies, in bits per character."""
    counts = Counter(key)
    return -sum(n / len(key) * math.log2(n / len(key)) for n in counts.values())


def _period(key: str) -> int:
    """Length of the shortest unit the key repeats (the key's length when it repeats none); KMP failure function."""
    fail = [0] * len(key)
    k = 0
    for i in range(1, len(key)):
        while k and key[i] != key[k]:
            k = fail[k - 1]
        if key[i] == key[k]:
            k += 1
        fail[i] = k
    return len(key) - fail[-1]


def _run_share(key: str) -> float:
    steps = [abs(ord(b) - ord(a)) <= 1 for a, b in zip(key, key[1:], strict=False)]
    return sum(steps) / len(steps)


def key_weakness(key: str) -> str | None:
    """Why *key* is too weak to key tombstones, or None when it is good enough."""
    if len(key.encode("utf-8")) < MIN_KEY_BYTES:
        return f"it must be at least {MIN_KEY_BYTES} bytes"
    letters = "".join(c for c in key.lower() if c.isalnum())
    if any(word in letters for word in PLACEHOLDER_WORDS):
        return "it is a placeholder (an example value), not a secret"
    if len(set(key)) < MIN_DISTINCT_CHARS:
        return f"it has fewer than {MIN_DISTINCT_CHARS} distinct characters"
    if bits_per_char(key) < MIN_BITS_PER_CHAR:
        return f"its characters carry less than {MIN_BITS_PER_CHAR} bits of entropy each"
    if _period(key) <= len(key) // 2:
        return "it repeats a shorter pattern"
    if _run_share(key) > MAX_RUN_SHARE:
        return "it is a run of neighbouring characters"
    return None
