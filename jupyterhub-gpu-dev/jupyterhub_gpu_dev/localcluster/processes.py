"""The local cluster's processes: whether one still runs, and stopping one with
everything it started."""

from __future__ import annotations

import contextlib
import os
import signal
import time


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (our own exited child) still answers kill 0
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def stop_group(pid: int, grace: float) -> None:
    """Stop a process started in its own session, and everything it started."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not alive(pid):
                break
            time.sleep(0.05)
        else:
            continue
        break
    # stragglers that left the group but kept our session are still ours
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
