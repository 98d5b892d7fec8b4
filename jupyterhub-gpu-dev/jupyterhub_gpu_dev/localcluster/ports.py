"""Loopback ports for servers this process starts, that nothing else can take meanwhile.

The servers the local cluster, the hub and the tests start (kube-apiserver, JupyterHub,
its proxy, Prometheus, slapd, ...) are told their port on their command line, so the
port is chosen before the server binds it. A port the kernel handed out with
``bind(port 0)`` is in its ephemeral range: between the choice and the bind, any
process's outgoing connection or ``bind(0)`` may be given the same port, and the server
then fails to start or, worse, a client reaches someone else's server.

So ports are chosen *outside* the kernel's ephemeral range, where the kernel never
hands one out by itself, and each is reserved across processes by an exclusive
``flock`` on a file named after it, held for the life of the process that chose it
(two test workers, or a test and a demo, never choose the same). A port is still
checked free by binding it before it is handed out.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

#: where the reservations are kept (one lock file per port; a file left behind by a
#: process that died holds no lock and is reused)
LOCK_DIR = Path(tempfile.gettempdir()) / "jupyterhub-gpu-ports"
#: below the ephemeral range: ports nobody's ``bind(0)`` or connection is given
_LOWEST = 20000
#: the reservations of this process, held open until it exits
_held: dict[int, int] = {}


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _candidates() -> range:
    low, high = _ephemeral_range()
    if low - _LOWEST >= 1000:
        return range(_LOWEST, low)
    # an unusual range starting low: above it, if there is room, else below 20000
    if 65535 - high >= 1000:
        return range(high + 1, 65536)
    return range(10000, _LOWEST)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(rng: random.Random | None = None) -> int:
    """A loopback port no other process can take before this one's server binds it."""
    rng = rng or random.SystemRandom()
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    candidates = _candidates()
    for _ in range(500):
        port = rng.choice(candidates)
        if port in _held:
            continue
        fd = os.open(LOCK_DIR / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if not _bindable(port):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            continue
        _held[port] = fd
        return port
    raise RuntimeError(
        f"no free loopback port in {candidates.start}-{candidates.stop - 1} after 500 tries "
        f"(reservations in {LOCK_DIR}); stop local clusters and hubs left running"
    )


def release(port: int) -> None:
    """Give a reservation back early (it is given back anyway when the process exits)."""
    fd = _held.pop(port, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
