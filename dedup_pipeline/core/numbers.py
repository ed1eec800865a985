"""Exact number handling: JSON numbers become Decimals, never floats."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from dedup_pipeline.core.errors import RecordError

# ISO 4217 minor-unit exponents that differ from the default of 2.
_CURRENCY_EXPONENTS = {
    "BHD": 3,
    "IQD": 3,
    "JOD": 3,
    "KWD": 3,
    "LYD": 3,
    "OMR": 3,
    "TND": 3,
    "BIF": 0,
    "CLP": 0,
    "DJF": 0,
    "GNF": 0,
    "ISK": 0,
    "JPY": 0,
    "KMF": 0,
    "KRW": 0,
    "PYG": 0,
    "RWF": 0,
    "UGX": 0,
    "UYI": 0,
    "VND": 0,
    "VUV": 0,
    "XAF": 0,
    "XOF": 0,
    "XPF": 0,
}


def currency_exponent(currency: str | None) -> int:
    """Digits after the decimal point in the currency's minor unit (default 2)."""
    return _CURRENCY_EXPONENTS.get((currency or "").strip().upper(), 2)


def parse_decimal(value: object, field: str) -> Decimal:
    """Read a price-like value exactly.

    Accepts Decimals, ints and numeric strings (surrounding whitespace allowed).
    Floats are refused: their text is not reproducible across platforms.
    """
    if isinstance(value, bool):
        raise RecordError(f"{field}: boolean is not a number")
    if isinstance(value, Decimal):
        number = value
    elif isinstance(value, int):
        number = Decimal(value)
    elif isinstance(value, float):
        raise RecordError(f"{field}: float is not hashable reproducibly; use a decimal string or minor units")
    elif isinstance(value, str):
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            raise RecordError(f"{field}: not a decimal number") from None
    else:
        raise RecordError(f"{field}: expected a number, got {type(value).__name__}")
    if not number.is_finite():
        raise RecordError(f"{field}: not a finite number")
    if not fits_exactly(number):
        raise RecordError(f"{field}: number out of range")
    return number


#: The most digits a number's exact plain text may have: Python's own limit for int <-> str conversions,
#: so `1e999999999` (a few bytes that would expand to a gigabyte of text) is refused, never expanded.
MAX_NUMBER_DIGITS = 4300
OUT_OF_RANGE = f"JSON number out of range (its exact text would exceed {MAX_NUMBER_DIGITS} digits)"


def fits_exactly(number: Decimal) -> bool:
    """Whether a finite Decimal's plain text (no exponent) has at most MAX_NUMBER_DIGITS digits."""
    adjusted = number.adjusted()
    if -1000 < adjusted < 1000 and number.as_tuple().exponent > -2000:  # the common case, cheaply
        return True
    _, digits, exponent = number.as_tuple()
    plain = len(digits) + exponent if exponent >= 0 else max(len(digits), 1 - exponent)
    return plain <= MAX_NUMBER_DIGITS


def json_decimal(text: str) -> Decimal:
    """`parse_float` for json.loads: the exact Decimal, refused (RecordError) when its exact text would be huge."""
    number = Decimal(text)
    if not fits_exactly(number):
        raise RecordError(OUT_OF_RANGE)
    return number


def plain_decimal(number: Decimal) -> str:
    """Shortest exact text without exponent: Decimal('9.90') -> '9.9', Decimal('1E+3') -> '1000'.

    Exact whatever the number of digits (no rounding to the decimal context's
    28 digits): two numbers that differ anywhere never get the same text.
    """
    if not number.is_finite() or not fits_exactly(number):
        raise RecordError("number out of range" if number.is_finite() else "not a finite number")
    text = format(number, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "0") else text


def to_minor_units(price: Decimal, currency: str | None) -> int | Decimal:
    """Price in the currency's minor unit: an int when exact, else the exact Decimal (never rounded)."""
    sign, digits, exponent = price.as_tuple()
    minor = Decimal((sign, digits, exponent + currency_exponent(currency)))
    if not fits_exactly(minor):  # a price within the digit limit can exceed it in minor units
        raise RecordError(f"price: out of range in minor units (more than {MAX_NUMBER_DIGITS} digits)")
    if minor == minor.to_integral_value():
        return int(minor)
    return minor
