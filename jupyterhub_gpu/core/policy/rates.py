"""A flavor's ``billing``: its rates, oldest first, each in force from its ``from``
until the next one's. Read through the ``RATE`` keys (``keys``). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .keys import RATE
from .schema import Errors, Reader
from .types import Rate


def parse_billing(e: Errors, path: str, raw: Any) -> tuple[Rate, ...]:
    """A flavor's rates, oldest first: one mapping (in force always), or a list whose
    every rate but the first begins ``from`` a moment later than the one before."""
    if raw is None:
        return ()
    listed = isinstance(raw, list)
    if not listed and not isinstance(raw, Mapping):
        e.add(
            path,
            f"expected a mapping like {{weight: 2, price: 3.5}} or a list of them, got {raw!r}",
        )
        return ()
    if listed and not raw:
        e.add(path, "expected at least one rate, e.g. [{weight: 2, price: 3.5}]")
        return ()
    rates: list[Rate] = []
    for i, item in enumerate(raw if listed else [raw]):
        where = f"{path}[{i}]" if listed else path
        r = Reader(e, where, item, RATE)
        since = r["from"]
        if i == 0:
            if "from" in r:
                e.add(
                    f"{where}.from",
                    "the first rate is in force from the start: remove from, or list "
                    "the rate before it first",
                )
            since = -math.inf
        elif "from" not in r:
            e.add(f"{where}.from", "required: when this rate begins (e.g. 2026-12-01)")
            continue
        if since is None:
            continue
        if rates and since <= rates[-1].since:
            e.add(
                f"{where}.from",
                "expected a moment after the rate before it: list rates oldest first",
            )
            continue
        weight, price = r["weight"], r["price"]
        if weight is None:
            continue
        rates.append(
            Rate(since=since, weight=float(weight), price=None if price is None else float(price))
        )
    priced = {rate.price is not None for rate in rates}
    if len(priced) > 1:
        e.add(path, "give every rate a price, or none: an hour without one would cost nothing")
    return tuple(rates)
