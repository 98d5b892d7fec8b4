"""Kubernetes quantities and durations, parsed exactly.

Admission adds and subtracts these thousands of times; exact integers (CPU in
millicores, memory in bytes) and fractions (GPU-equivalents) mean a sequence of
admits and releases always returns to exactly zero, never to 1e-17.
"""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIXES = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^([+]?[0-9]+(?:\.[0-9]*)?|[+]?\.[0-9]+)(?:[eE]([+-]?[0-9]+))?([a-zA-Z]*)$")
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class QuantityError(ValueError):
    """Not a quantity; the message says what was expected."""


def parse_quantity(value: object) -> Fraction:
    """``"500m"`` → 1/2, ``"16Gi"`` → 17179869184, ``2`` → 2. Negative values are refused."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity such as 4, 500m or 16Gi, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise QuantityError(f"expected a quantity >= 0, got {value!r}")
        return Fraction(value)
    if isinstance(value, float):
        if value < 0 or value != value:
            raise QuantityError(f"expected a quantity >= 0, got {value!r}")
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"expected a quantity such as 4, 500m or 16Gi, got {value!r}")
    match = _QUANTITY.match(value.strip())
    if not match or match.group(3) not in _SUFFIXES:
        raise QuantityError(f"expected a quantity such as 4, 500m or 16Gi, got {value!r}")
    number = Fraction(match.group(1))
    if match.group(2):
        number *= Fraction(10) ** int(match.group(2))
    return number * _SUFFIXES[match.group(3)]


def parse_millicores(value: object) -> int:
    """CPU in whole millicores (Kubernetes' own precision), rounded up."""
    milli = parse_quantity(value) * 1000
    return -(-milli.numerator // milli.denominator)


def parse_bytes(value: object) -> int:
    """Memory in whole bytes, rounded up."""
    size = parse_quantity(value)
    return -(-size.numerator // size.denominator)


def parse_number(value: object) -> Fraction:
    """A plain number >= 0 (int, float or numeric string): GPU counts and GPU-equivalents."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a number, got {value!r}")
    if isinstance(value, int | float):
        number = Fraction(str(value)) if isinstance(value, float) else Fraction(value)
    elif isinstance(value, str):
        try:
            number = Fraction(value.strip())
        except ValueError:
            raise QuantityError(f"expected a number, got {value!r}") from None
    else:
        raise QuantityError(f"expected a number, got {value!r}")
    if number < 0:
        raise QuantityError(f"expected a number >= 0, got {value!r}")
    return number


def format_duration(seconds: int) -> str:
    """8h, 1h30m, 25s: a duration as the policy writes it (``parse_duration`` reads it)."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return text + (f"{secs}s" if secs or not text else "")


def parse_duration(value: object) -> int:
    """Seconds from ``8h``, ``90m``, ``1d12h``, ``3600s`` or a number of seconds."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        match = _DURATION.match(value.strip())
        if match and any(match.groups()):
            d, h, m, s = (int(x or 0) for x in match.groups())
            total = ((d * 24 + h) * 60 + m) * 60 + s
            if total > 0:
                return total
    raise QuantityError(f"expected a duration such as 8h, 90m or 1d12h, got {value!r}")


def format_cpu(millicores: int) -> str:
    return f"{millicores // 1000}" if millicores % 1000 == 0 else f"{millicores}m"


def format_bytes(size: int) -> str:
    for suffix, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{suffix}"
    return str(size)


def format_gpus(value: Fraction) -> str:
    """GPU-equivalents for people: 12, 11.5, 0.25; thirds and sevenths to two places."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.2f}".rstrip("0").rstrip(".")
    return text
