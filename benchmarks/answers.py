"""Two versions' answers compared as their JSON shows them."""

from __future__ import annotations


def agree(a, b) -> bool:
    """The same JSON, numbers to the 4 decimals shown (one unit apart at most)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(agree(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(agree, a, b))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1.5e-4
    return a == b
