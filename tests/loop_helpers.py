"""For the tests that a party which hangs never stalls the hub's event loop: a server
that accepts and never answers, and a heartbeat that measures the loop's stalls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A port on 127.0.0.1 (chosen by the OS) that accepts connections and never says
    a word, as a hung directory or identity provider does."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # kept open, never read, never answered

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in held:
            writer.close()


class Heartbeat:
    """Beats on the running event loop every 10 ms; ``worst`` is the longest gap
    between two beats (a loop blocked for a second shows a gap of a second)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task | None = None

    async def _beat(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(0.01)
            now = loop.time()
            self.worst = max(self.worst, now - last)
            last = now

    def __enter__(self) -> Heartbeat:
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
