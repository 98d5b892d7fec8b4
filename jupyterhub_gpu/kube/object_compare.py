"""The reconciler's pure decision: is a live object already what the policy wants
(every wanted field there, quantities compared as quantities), and the hash of what
was last applied."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from ..core.quantities import QuantityError, parse_quantity

APPLIED_HASH = "gpu.jupyterhub.org/applied-hash"


def applied_hash(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


_QUANTITY_LIKE = re.compile(r"^[+-]?[0-9.]+([eE][+-]?[0-9]+)?[A-Za-z]{0,2}$")


def _same_scalar(want: Any, have: Any) -> bool:
    if want == have:
        return True
    if isinstance(want, str) and isinstance(have, str) and _QUANTITY_LIKE.match(want):
        try:  # the API server writes quantities in canonical form (2048Mi -> 2Gi)
            return parse_quantity(want) == parse_quantity(have)
        except QuantityError:
            return False
    if isinstance(want, int | float) and isinstance(have, int | float):
        return Fraction(want) == Fraction(have)
    return False


def contains(live: Any, want: Any) -> bool:
    """True when every field of ``want`` has its value in ``live`` (defaults may be added)."""
    if isinstance(want, Mapping):
        # the API server omits empty and false fields (Go's omitempty)
        return isinstance(live, Mapping) and all(
            contains(live[k], v) if k in live else v in (False, 0, "", None, {}, [])
            for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(live, list)
            and len(live) == len(want)
            and all(contains(a, b) for a, b in zip(live, want, strict=True))
        )
    return _same_scalar(want, live)
