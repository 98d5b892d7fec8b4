"""The ``jupyterhub-gpu`` command as a user runs it: a subprocess, its output captured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``jupyterhub-gpu ARGS`` from the repository's root (relative paths work)."""
    return subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpu.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )
