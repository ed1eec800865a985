"""Secret-key strength (dedup_pipeline.core.keys): generated keys pass, placeholders and patterns do not."""

from __future__ import annotations

import secrets
import subprocess

import pytest

from dedup_pipeline.core.keys import MAKE_A_KEY, bits_per_char, key_weakness

#: The key deploy/env.example once carried, and the usual ways a weak key looks.
WEAK = {
    "change-me-to-a-long-random-secret": "placeholder",
    "CHANGE_ME_CHANGE_ME_CHANGE_ME_CHANGE_ME": "placeholder",
    "your-tombstone-key-goes-here-0123456789": "placeholder",
    "a" * 64: "distinct characters",
    "abababababababababababababababab": "distinct characters",
    "0000111122223333444455556666777788889999": "run",
    "Kx9!mQ2#pL7$" * 3: "repeats a shorter pattern",
    "abcdefghijklmnopqrstuvwxyz0123456789ABCDEF": "run",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabcdefghij": "entropy",
    "short": "at least 32 bytes",
}


@pytest.mark.parametrize("key, reason", WEAK.items())
def test_weak_keys_are_refused_with_the_reason(key, reason):
    weakness = key_weakness(key)
    assert weakness is not None and reason in weakness
    assert key not in weakness


def test_generated_keys_pass():
    for _ in range(2000):
        assert key_weakness(secrets.token_urlsafe(32)) is None
        assert key_weakness(secrets.token_hex(32)) is None


def test_the_command_the_error_names_makes_a_good_key():
    made = subprocess.run(["python", "-c", MAKE_A_KEY.split('"')[1]], capture_output=True, text=True, check=True)
    assert key_weakness(made.stdout.strip()) is None


def test_bits_per_char():
    assert bits_per_char("aaaa") == 0
    assert bits_per_char("abab") == 1
    assert bits_per_char("0123456789abcdef") == 4
