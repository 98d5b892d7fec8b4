"""The command line's one error of its own."""

from __future__ import annotations


class UserError(Exception):
    """An error the user fixes; printed without a traceback."""
