"""GPU use over time as users ask for it, never in enforcement's way.

``api/history`` and the dashboard's charts are what any member can ask for, as
often as they like. Enforcement (the GPU-time pass that writes and reads the
usage database, and the budget rule that acts on what it read) must never wait
behind them, or a flood of requests could hold back every budget's stop. So:

- **Their own threads and connections.** A history's records older than the
  book kept in memory are read, and every history is summed, on the readers'
  executor and through the readers' own connection pool; the pass and the
  rules keep theirs (the loop's default executor, the service's store), so a
  reader never takes a thread or a connection they need.
- **Windows aligned to the step.** ``from`` is rounded down and ``to`` up to a
  multiple of the step, so requests a second apart ask for the same window and
  share one answer, kept until the next pass reads the book again (a window that
  ended before the months kept in memory, whose rows no pass changes, until it
  is pushed out by newer ones). Identical requests made while one is computed
  wait for that one.
- **Bounded.** At most ``per_user`` computations at once per user and ``total``
  overall; a request beyond is refused at once (``TooManyReads``, the API's
  429 with ``Retry-After``), a cached answer never.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import Counter, deque
from concurrent.futures import Executor
from typing import Any

from ..accounting.store import AccountingUnavailable, UsageStore
from ..core.budgets import UsageRecord
from ..core.showback import Series, check_history, history

#: answers kept (group, window and step each): the dashboards' and the API's recent asks
CACHED = 512
#: how often (seconds) a thread summing history hands the interpreter to another: the
#: pass's database calls release it and must get it back at each step, and with
#: Python's 5 ms each of their steps could wait that long behind a reader's sums
SWITCH_INTERVAL = 0.001

HistoryKey = tuple[str, float, float, float]
#: what an answer of a window older than the book is made from: rows no pass changes
SETTLED = "settled"


class TooManyReads(Exception):
    """More history computations than allowed at once: try again in ``retry_after`` s."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def enforcement_first(loop: asyncio.AbstractEventLoop, executor: Executor) -> None:
    """Give the pass, the rules and the server events ``executor`` as the loop's default
    (readers never use it: they have their own), and let a thread waiting for the
    interpreter have it within a millisecond."""
    loop.set_default_executor(executor)
    sys.setswitchinterval(SWITCH_INTERVAL)


def aligned(since: float, until: float, step: float) -> tuple[float, float]:
    """The window ``since``-``until`` widened to whole steps counted from the epoch: a
    request a second later asks for the same window (a day's steps start at midnight
    UTC, an hour's on the hour)."""
    return math.floor(since / step) * step, math.ceil(until / step) * step


class HistoryReads:
    """Histories for the API and the dashboard: cached by aligned window, computed on
    the readers' executor and store, at most ``per_user`` at once per user and
    ``total`` overall, each waited for at most ``timeout`` seconds."""

    def __init__(
        self,
        gpu_time: Any,
        executor: Executor,
        store: UsageStore,
        *,
        per_user: int,
        total: int,
        timeout: float,
    ) -> None:
        self.gpu_time = gpu_time
        self.executor = executor
        self.store = store
        self.per_user = max(per_user, 1)
        self.total = max(total, 1)
        self.timeout = timeout
        #: answers by window, with the pass (the book's read time) they were made from,
        #: or SETTLED for a window older than the book
        self._cache: dict[HistoryKey, tuple[float | str | None, Series]] = {}
        #: the computations under way, by window (their askers share them)
        self._running: dict[HistoryKey, asyncio.Future[Series]] = {}
        self._by_user: Counter[str] = Counter()
        #: how long recent computations took (seconds): what Retry-After says
        self._took: deque[float] = deque(maxlen=16)
        #: how many answers came from the cache, and how many were computed
        self.hits = 0
        self.computed = 0

    @property
    def busy(self) -> int:
        """Computations under way now."""
        return len(self._running)

    async def history(
        self, user: str, group: str, since: float, until: float, step: float
    ) -> Series:
        """``group``'s GPU use from ``since`` to ``until`` (aligned to ``step``), as asked by
        ``user``. Raises ``ShowbackError`` for a range or step not allowed (before any
        record is read), ``TooManyReads`` beyond the bounds, ``AccountingUnavailable`` when
        the database does not answer (or not within ``timeout``)."""
        check_history(since, until, step)
        since, until = aligned(since, until, step)
        check_history(since, until, step)
        key = (group, since, until, step)
        made_from = self.gpu_time.snapshot.read_at
        if until <= self.gpu_time.clock() - self.gpu_time.book.horizon:
            made_from = SETTLED
        cached = self._cache.get(key)
        if cached is not None and cached[0] == made_from:
            self.hits += 1
            return cached[1]
        running = self._running.get(key)
        if running is None:
            running = self._begin(user, key, made_from)
        try:
            # shielded: an asker who stops waiting leaves the answer to the others
            return await asyncio.wait_for(asyncio.shield(running), self.timeout)
        except TimeoutError:
            raise AccountingUnavailable(
                f"GPU use over time for {group} was not computed within {self.timeout:g} s: "
                "the usage database is slow or the service is busy; try again later"
            ) from None

    def _begin(
        self, user: str, key: HistoryKey, made_from: float | str | None
    ) -> asyncio.Future[Series]:
        if self._by_user[user] >= self.per_user or len(self._running) >= self.total:
            mine = self._by_user[user] >= self.per_user
            raise TooManyReads(
                f"{self._by_user[user] if mine else len(self._running)} computations of GPU use "
                f"over time are under way{' for you' if mine else ''}, the most allowed at "
                f"once; ask again in a moment",
                self.retry_after(),
            )
        self._by_user[user] += 1
        began = time.monotonic()
        running = asyncio.ensure_future(self._compute(key))
        self._running[key] = running

        def done(future: asyncio.Future[Series]) -> None:
            # the slot is the computation's, not the asker's: it frees when the work ends
            self._running.pop(key, None)
            self._by_user[user] -= 1
            if self._by_user[user] <= 0:
                del self._by_user[user]
            if future.cancelled() or future.exception() is not None:
                return
            self._took.append(time.monotonic() - began)
            self.computed += 1
            if len(self._cache) >= CACHED:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = (made_from, future.result())

        running.add_done_callback(done)
        return running

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the longest recent computation, at least 1."""
        return max(1, math.ceil(max(self._took, default=1.0)))

    async def _compute(self, key: HistoryKey) -> Series:
        group, since, until, step = key
        gpu_time = self.gpu_time
        loop = asyncio.get_running_loop()
        now = gpu_time.clock()
        records: list[UsageRecord]
        if gpu_time.snapshot.read_at is not None and since >= now - gpu_time.book.horizon:
            # the book's index of a group holds its children's records too: its family's;
            # copied here, on the loop, where the pass changes the book
            records = list(gpu_time.book.group_records(group))
        else:
            family = sorted(gpu_time.family(group))
            records = await loop.run_in_executor(
                self.executor, self.store.overlapping, since, until, family
            )
        running = frozenset(gpu_time.running)
        return await loop.run_in_executor(
            self.executor, history, records, since, until, step, now, running
        )
