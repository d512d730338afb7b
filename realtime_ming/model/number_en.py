"""English number normalisation for the talker: digits, currencies, units, fractions → words.

Reproduces [MING] `front/number_en.normalize_numbers` (docs/model.md §5.11 step 3) as recorded by the
`talker_text_front` fixture; the spelling of numbers comes from `inflect` (the fixture used 7.6.0).
"""

from __future__ import annotations

import re
import threading
from functools import cache

import inflect

__all__ = ["normalize_numbers"]

_COMMA_NUMBER_RE = re.compile(r"([0-9][0-9,]+[0-9])")
_PERCENT_RE = re.compile(r"(-?[0-9.,]*[0-9]+)%")
_POUNDS_RE = re.compile(r"\u00a3(-?[0-9,]*[0-9]+(?:\.[0-9]+)?)")
_DOLLARS_RE = re.compile(r"\$(-?[0-9.,]*[0-9]+(?:\.[0-9]+)?)")
_FRACTION_RE = re.compile(r"([0-9]+)/([0-9]+)")
_ORDINAL_RE = re.compile(r"\b[0-9]+(st|nd|rd|th)\b")
_NUMBER_RE = re.compile(r"\b-?[0-9]+(?:\.[0-9]+)?\b")
_UNIT_RE = re.compile(
    r"\b(-?\d+(?:\.\d+)?)\s*(ms|s|Hz|kHz|MHz|GHz|kb|mb|gb|tb|KB|MB|GB|TB|bps|kbps|Mbps|Gbps|cm|km|kg|V|A|W"
    r"|\u00b0C|\u00b0F)\b",
    re.IGNORECASE,
)
_VERSION_RE = re.compile(r"\b([a-zA-Z]+)(-?)([0-9]+(?:\.[0-9]+)?)\b")
_WHITESPACE_RE = re.compile(r"\s+")

_UNIT_WORDS = {
    "ms": "milliseconds", "s": "seconds", "hz": "hertz", "khz": "kilohertz", "mhz": "megahertz",
    "ghz": "gigahertz", "kb": "kilobytes", "mb": "megabytes", "gb": "gigabytes", "tb": "terabytes",
    "kbps": "kilobits per second", "mbps": "megabits per second", "gbps": "gigabits per second",
    "bps": "bits per second", "cm": "centimeters", "km": "kilometers", "kg": "kilograms", "v": "volts",
    "a": "amperes", "w": "watts", "\u00b0c": "degrees celsius", "\u00b0f": "degrees fahrenheit",
}
# Denominators spoken by name; any other denominator is its singular ordinal ("2/3" -> "two third").
_NAMED_DENOMINATORS = {2: ("half", "halves"), 4: ("quarter", "quarters")}

# inflect.engine.number_to_words stores its arguments on the engine, so calls must not interleave.
_INFLECT_LOCK = threading.Lock()


@cache
def _engine() -> inflect.engine:
    return inflect.engine()


def _cardinal(value: int, andword: str = "") -> str:
    return _engine().number_to_words(value, andword=andword)


def _point_digits(digits: str, andword: str) -> str:
    return " ".join(_cardinal(int(d), andword) for d in digits)


def _number_words(num_str: str) -> str | None:
    """Words for '-12', '3.14', '.5'; None when the string is not a plain number."""
    is_negative = num_str.startswith("-")
    clean = num_str.lstrip("-") or "0"
    if "." in clean:
        integer, decimals = clean.split(".", 1)
        integer = integer or "0"
        if not integer.isdigit() or not decimals.isdigit():
            return None
        words = f"{_cardinal(int(integer))} point {_point_digits(decimals, '')}"
    else:
        if not clean.isdigit():
            return None
        words = _cardinal(int(clean))
    return f"minus {words}" if is_negative else words


def _safe_words(num_str: str) -> str | None:
    try:
        return _number_words(num_str)
    except Exception:  # inflect rejects numbers beyond its range; the reference keeps the digits then
        return None


def _expand_unit(m: re.Match) -> str:
    num_str, unit = m.group(1), m.group(2).lower()
    words = _safe_words(num_str)
    return f" {words} {_UNIT_WORDS.get(unit, unit)} " if words else f" {num_str} {unit} "


def _currency(singular: str, plural: str):
    def expand(m: re.Match) -> str:
        num_str = m.group(1)
        words = _safe_words(num_str)
        if not words:
            return f" {num_str} {plural} "
        unit = singular if abs(float(num_str.lstrip("-") or "0")) == 1.0 else plural
        return f" {words} {unit} "

    return expand


def _expand_fraction(m: re.Match) -> str:
    numerator, denominator = int(m.group(1)), int(m.group(2))
    try:
        head = _cardinal(numerator, "and")
        if denominator in _NAMED_DENOMINATORS:
            singular, plural = _NAMED_DENOMINATORS[denominator]
            return f" {head} {singular if numerator == 1 else plural} "
        return f" {head} {_engine().ordinal(_cardinal(denominator, 'and'))} "
    except Exception:
        return m.group(0)


def _expand_percent(m: re.Match) -> str:
    words = _safe_words(m.group(1))
    return f" {words or m.group(1)} percent "


def _expand_ordinal(m: re.Match) -> str:
    # The reference speaks ordinals as cardinals: "1st" -> "one", "22nd" -> "twenty-two".
    try:
        return f" {_cardinal(int(m.group(0)[:-2]), 'and')} "
    except Exception:
        return m.group(0)


def _expand_version(m: re.Match) -> str:
    # "v2.1" -> "v two point one"; unlike other numbers the reference keeps inflect's default "and".
    prefix, num_str = m.group(1), m.group(3)
    try:
        if "." in num_str:
            integer, decimals = num_str.split(".", 1)
            words = f"{_cardinal(int(integer), 'and')} point {_point_digits(decimals, 'and')}"
        else:
            words = _cardinal(int(num_str), "and")
    except Exception:
        return m.group(0)
    return f"{prefix} {words}"


def _expand_number(m: re.Match) -> str:
    words = _safe_words(m.group(0))
    return f" {words or m.group(0)} "


_RULES = (
    (_COMMA_NUMBER_RE, lambda m: m.group(1).replace(",", "")),
    (_UNIT_RE, _expand_unit),
    (_POUNDS_RE, _currency("pound", "pounds")),
    (_DOLLARS_RE, _currency("dollar", "dollars")),
    (_FRACTION_RE, _expand_fraction),
    (_PERCENT_RE, _expand_percent),
    (_ORDINAL_RE, _expand_ordinal),
    (_VERSION_RE, _expand_version),
    (_NUMBER_RE, _expand_number),
)


def normalize_numbers(text: str) -> str:
    """Spell out the numbers of an English text; whitespace is collapsed and the ends stripped.

    Punctuation next to a number ends up space-separated ("22nd." -> "twenty-two .", "5:30" ->
    "five : thirty"), as in the reference. Thread-safe.
    """
    with _INFLECT_LOCK:
        for pattern, expand in _RULES:
            text = pattern.sub(expand, text)
    return _WHITESPACE_RE.sub(" ", text).strip()
