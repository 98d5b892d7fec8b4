"""What a piece of async work costs its event loop: the loop's time in it, the loop
thread's CPU time, its longest callback, and a heartbeat's longest gap."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from loop_helpers import Heartbeat


class LoopTimer:
    """Every callback the event loop runs, timed: ``busy`` their sum, ``cpu`` the loop
    thread's CPU time in them (without its waits for the interpreter, which threads
    hold meanwhile, nor for a CPU), ``worst`` the longest. One per process."""

    def __init__(self) -> None:
        self.busy = self.cpu = self.worst = 0.0
        original = asyncio.events.Handle._run

        def timed(handle: asyncio.events.Handle) -> None:
            began, cpu = time.perf_counter(), time.thread_time()
            try:
                original(handle)
            finally:
                took = time.perf_counter() - began
                self.busy += took
                self.cpu += time.thread_time() - cpu
                if took > self.worst:
                    self.worst = took

        asyncio.events.Handle._run = timed  # type: ignore[method-assign]

    async def window(self, work: Awaitable) -> dict[str, float]:
        """The loop's time, CPU time and longest callback while ``work`` runs (a task
        of its own: the caller's own step is not in it), the heartbeat's longest gap
        (a beat every 10 ms), and the wall time."""
        with Heartbeat() as beat:
            await asyncio.sleep(0.02)  # the heartbeat under way
            self.busy = self.cpu = self.worst = 0.0
            began = time.perf_counter()
            await asyncio.ensure_future(work)
            wall = time.perf_counter() - began
            out = {"loop": self.busy, "cpu": self.cpu, "callback": self.worst, "wall": wall}
            await asyncio.sleep(0.02)  # a beat after the work's last step
        return {**out, "gap": beat.worst}
