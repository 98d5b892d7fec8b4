"""How every message a user reads writes numbers, units, counts, durations and times.

One place for the rules, so that a refusal, the spawn form, a notice, the dashboard
and ``api/usage`` say the same thing the same way (the JupyterLab extension keeps
the same rules in ``jupyterlab-gpu/src/words.ts``, tested against these):

- **numbers** (GPU-hours above all): whole numbers without ``.0`` (``2000``), one
  decimal from 1 up (``20.5``), three significant digits below 1 (``0.025``,
  ``0.0125``); trailing zeros dropped; halves rounded up. Numbers said together
  (``used 1999.96 of 2000``) get the decimals that keep two different numbers
  different, up to ``MAX_DECIMALS``.
- **units**: one name each (``GPU-hours``), singular for exactly one
  (``1 GPU-hour``, ``1 spawn``), plural otherwise.
- **durations** in words, the two largest units (``8 hours``, ``1 hour 30 minutes``,
  ``2 days 4 hours``); a budget's window after "the last" without a lone one (``the
  last day``, ``the last 30 days``).
- **times** as ``2026-12-01 14:05 UTC``: a server-side text does not know the
  reader's time zone, so it says UTC, once; a page in the browser shows the same
  format in the reader's zone (``2026-12-01 15:05 CET``).

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from .quantities import format_gpus

#: the unit of GPU time, in every message
GPU_HOURS = "GPU-hours"
GPU_HOUR = "GPU-hour"
BILLED_UNITS = "billed units"
BILLED_UNIT = "billed unit"
#: the most decimals a number gets to stay different from another said with it
MAX_DECIMALS = 4


def _decimals(value: float) -> int:
    """The decimals ``value`` is written with alone: one from 1 up (and for 0), three
    significant digits below 1."""
    size = abs(value)
    if size >= 1 or size == 0:
        return 1
    return min(2 - math.floor(math.log10(size)), 6)


def _fixed(value: float, decimals: int, grouped: bool) -> str:
    """``value`` rounded half up to ``decimals`` (as the exact binary value is: what
    JavaScript's ``toFixed`` does), trailing zeros dropped."""
    rounded = Decimal(value).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    text = f"{rounded:,f}" if grouped else f"{rounded:f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def numbers(values: Sequence[float], *, grouped: bool = False) -> list[str]:
    """``values`` as said together in one message: each as ``number`` writes it, with
    more decimals for all while two different values would read the same."""
    floats = [float(v) for v in values]
    extra = 0
    while True:
        texts = [
            _fixed(v, min(_decimals(v) + extra, max(_decimals(v), MAX_DECIMALS)), grouped)
            for v in floats
        ]
        clash = any(
            texts[i] == texts[j] and floats[i] != floats[j]
            for i in range(len(floats))
            for j in range(i + 1, len(floats))
        )
        if not clash or all(_decimals(v) + extra >= MAX_DECIMALS for v in floats):
            return texts
        extra += 1


def number(value: float, *, grouped: bool = False) -> str:
    """A number for people: ``2000``, ``20.5``, ``0.025``; ``grouped``: thousands
    separated, for tables (``12,345.6``)."""
    return numbers([value], grouped=grouped)[0]


def of(part: float, whole: float) -> str:
    """``12.5 of 100``: two numbers said together."""
    a, b = numbers([part, whole])
    return f"{a} of {b}"


def noun(text: str, singular: str, plural: str | None = None) -> str:
    """The unit after a number already written (``text``): singular for exactly one."""
    return singular if text == "1" else (plural or singular + "s")


def count(n: float, singular: str, plural: str | None = None) -> str:
    """``1 spawn``, ``2 spawns``, ``0.5 GPUs``."""
    text = number(n)
    return f"{text} {noun(text, singular, plural)}"


def gpus(value: Fraction | float) -> str:
    """``1 GPU``, ``2 GPUs``, ``0.5 GPUs``, ``0.33 GPUs``: GPU-equivalents as the policy
    counts them (``quantities.format_gpus``)."""
    text = format_gpus(value if isinstance(value, Fraction) else Fraction(value))
    return f"{text} {noun(text, 'GPU')}"


def gpu_hours(value: float) -> str:
    """``12.5 GPU-hours``, ``1 GPU-hour``."""
    return count(value, GPU_HOUR, GPU_HOURS)


def billed_units(value: float) -> str:
    """``12.5 billed units``, ``1 billed unit``."""
    return count(value, BILLED_UNIT, BILLED_UNITS)


_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def duration(seconds: float) -> str:
    """A duration in words, its two largest units: ``45 seconds``, ``8 hours``,
    ``1 hour 30 minutes``, ``2 days 4 hours`` (what is smaller is left out)."""
    left = max(math.floor(seconds + 0.5), 0)  # halves up, as the extension rounds
    if left == 0:
        return "0 seconds"
    for i, (name, size) in enumerate(_UNITS):
        if left >= size:
            first, left = divmod(left, size)
            words = count(first, name)
            if i + 1 < len(_UNITS):
                smaller, size_of = _UNITS[i + 1]
                second = left // size_of
                if second:
                    words += " " + count(second, smaller)
            return words
    raise AssertionError("unreachable")  # pragma: no cover


def period(seconds: float) -> str:
    """A rolling window after "the last": ``day``, ``30 days``, ``1 hour 30 minutes``."""
    text = duration(seconds)
    return text[2:] if text.startswith("1 ") and " " not in text[2:] else text


def moment(epoch: float) -> str:
    """A moment as a message says it where the reader's time zone is not known:
    ``2026-12-01 14:05 UTC``."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")
