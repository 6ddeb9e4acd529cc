"""Numbers as English words, for the sanitizer's ``numbers="spell"`` option.

Plain cardinals only ("1999" -> "one thousand nine hundred ninety nine"):
the option exists to measure whether spelled numbers tokenize closer to the
training data than digits, not to be a full text normaliser.
"""

from __future__ import annotations

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))


def spell_integer(n: int) -> str:
    """``n >= 0`` in words; beyond the trillions the digits are read one by one."""
    if n < 0:
        raise ValueError("spell_integer takes n >= 0")
    if n >= 10**15:
        return " ".join(_ONES[int(d)] for d in str(n))
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (f" {_ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {spell_integer(rest)}" if rest else "")
    for scale, name in _SCALES:
        if n >= scale:
            head, rest = divmod(n, scale)
            return f"{spell_integer(head)} {name}" + (f" {spell_integer(rest)}" if rest else "")
    raise AssertionError("unreachable")


def spell_number(text: str) -> str:
    """Digits with optional thousands commas and a decimal part: ``"1,234.5"``."""
    whole, _, frac = text.replace(",", "").partition(".")
    words = spell_integer(int(whole)) if whole else "zero"
    if frac:
        words += " point " + " ".join(_ONES[int(d)] for d in frac)
    return words
