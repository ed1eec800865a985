"""The warehouse's JSON columns as text: orjson's speed, the standard library's exact results.

Every row of `canonical_records` holds three JSON values, written once by the
canonical rung and read back by the exact rung; encoding and decoding them with
the `json` module were the largest single costs of both steps. orjson does the
same work several times faster and gives the same values, with two
exceptions, which go to the `json` module instead:
- reading, an integer beyond 64 bits comes back from orjson as a float (lossy);
- writing, orjson writes a NaN or an infinity as null (lossy), where `json`
  writes a token the database refuses, so the error stays loud.
A value holding a float outside the safe range is therefore decoded or encoded
again by `json`, as is anything orjson refuses (a Decimal, a huge integer, a
lone surrogate, a number beyond a double's range).
"""

from __future__ import annotations

import json
import math

import orjson

#: Integers at least this large (in magnitude) may have come back from orjson as a float.
_BEYOND_64_BITS = 2.0**63


def _floats_within(value, bound: float) -> bool:
    """Whether every float in `value` (a decoded JSON value, nested or not) lies strictly within ±`bound`."""
    kind = type(value)
    if kind is float:
        return -bound < value < bound
    if kind is dict:
        value = value.values()
    elif kind is not list and kind is not tuple:
        return True
    for item in value:
        kind = type(item)
        if kind is str:
            continue
        if kind is float:
            if not -bound < item < bound:  # also true of NaN
                return False
        elif (kind is dict or kind is list or kind is tuple) and not _floats_within(item, bound):
            return False
    return True


class EncodedJson(str):
    """JSON text as the warehouse stored it, carried as it is.

    The exact rung reads each staged payload and, for a new or changed record,
    writes it to `records` unchanged: decoding it to write it again would cost
    more than any other step of reading a chunk. A value of this type is written
    by `copy_rows` as the text it is; `decoded` gives its value where a step
    needs the fields (erasure fingerprints).
    """

    __slots__ = ()


def decoded(value):
    """The value of an `EncodedJson` text; any other value as it is."""
    return loads(value) if isinstance(value, EncodedJson) else value


def loads(data: bytes | bytearray | memoryview | str):
    """The value of one JSON text, exactly as ``json.loads`` gives it."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    else:
        if _floats_within(value, _BEYOND_64_BITS):
            return value
    return json.loads(bytes(data) if isinstance(data, memoryview) else data)


#: orjson writes datetimes, dataclasses and subclasses of the JSON types its own way; `json` decides for them.
_PLAIN_TYPES_ONLY = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def dumps(value) -> str:
    """Compact JSON text of `value` (non-ASCII as it is), with the values ``json.dumps`` would write."""
    if _floats_within(value, math.inf):
        try:
            return orjson.dumps(value, option=_PLAIN_TYPES_ONLY).decode("utf-8")
        except TypeError:
            pass
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
