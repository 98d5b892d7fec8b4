"""The hub's home and spawn pages say why each of the user's servers last stopped.

The GPU service records every stop with its reason in the usage database
(``accounting.events``): its own (idle, budget, max_runtime, over its limit) and
those nobody scheduled (a preemption, an eviction, a stop through the hub). The
hub reads the user's last stops from the same database when it renders these two
pages, through JupyterHub's own extension points: ``template_vars`` (a callable,
given the user) and two templates in ``template_paths`` that extend JupyterHub's
own (``templates/home.html``, ``templates/spawn.html``) by a block above the page's
content, so a site's own templates, listed first, still win.

The database is never read on the hub's event loop: JupyterHub renders these pages
with Jinja's async mode, so the template variable is an async iterable whose read
runs in a thread of its own (at most ``READERS`` at once, one per user at a time),
awaited at most ``READ_TIMEOUT`` seconds. A database that is slow, locked or
unreachable delays only the block of stops, never the hub: past the timeout the
page renders with what was read before (or none), and the read, once it ends,
serves the next page. Calling the variable (JupyterHub does, for every page and
every user) reads nothing.

``show_last_stops(c)`` sets both; the hub image's ``jupyterhub_config.d`` file calls
it (z2jh), as may a plain ``jupyterhub_config.py``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from traitlets.config import Config

from ..accounting.events import EventStore
from ..accounting.store import AccountingUnavailable, UsageStore
from ..core import words

log = logging.getLogger("jupyterhub_gpu.hub.pages")

TEMPLATES = Path(__file__).parent / "templates"
#: the name the templates read
TEMPLATE_VAR = "gpu_last_stops"
#: stops older than this are not shown (seconds)
SHOWN_FOR = 7 * 86400
#: a user's stops are read again at most this often (seconds): a page reload is no query
CACHE_FOR = 5.0
#: threads reading the usage database for the pages (reads beyond wait for one)
READERS = 2
#: reads begun and not finished, at most (a hung database holds them all: a page
#: rendered meanwhile starts no more and shows what was read before)
MAX_PENDING = 32
#: how long a page waits for a user's stops before it renders without them (seconds)
READ_TIMEOUT = 2.0

Stops = list[dict[str, Any]]


class LastStops:
    """The ``template_vars`` entry: called with the user for every page (reading
    nothing), it gives a ``UserStops``, what the templates iterate: the user's
    servers' last stops, for servers not running now, newest first, as dicts."""

    def __init__(
        self,
        url: Callable[[], str],
        clock: Callable[[], float] = time.time,
        *,
        timeout: float = READ_TIMEOUT,
        readers: int = READERS,
    ) -> None:
        self._url = url
        self._store: EventStore | None = None
        self._store_lock = threading.Lock()
        self.clock = clock
        self.timeout = timeout
        self._executor = ThreadPoolExecutor(
            max_workers=readers, thread_name_prefix="jupyterhub-gpu-last-stops"
        )
        self._cache: dict[str, tuple[float, Stops]] = {}
        #: each user's read under way: pages rendered meanwhile wait for the same one
        self._reading: dict[str, asyncio.Future[Stops]] = {}

    def __deepcopy__(self, memo: dict) -> LastStops:
        # traitlets deep-copies config values (c.JupyterHub.template_vars) as it loads
        # them; this one holds a thread pool and a lock, and is one per hub by design
        return self

    def __call__(self, user: Any) -> UserStops | list:
        if user is None:
            return []
        return UserStops(self, user)

    def cached(self, user: Any) -> Stops:
        """What was last read for ``user`` (never reads)."""
        cached = self._cache.get(user.name)
        return self._not_running(user, cached[1] if cached else [])

    async def fresh(self, user: Any) -> Stops:
        """The user's stops, read again (off the event loop) when older than
        ``CACHE_FOR``; within ``timeout``, else what was read before."""
        now = self.clock()
        cached = self._cache.get(user.name)
        if cached is not None and now - cached[0] <= CACHE_FOR:
            return self._not_running(user, cached[1])
        reading = self._reading.get(user.name)
        if reading is None:
            if len(self._reading) >= MAX_PENDING:
                log.warning(
                    "The hub's pages show earlier last stops: %d reads of the usage database "
                    "have not finished (is it slow or locked?)",
                    len(self._reading),
                )
                return self.cached(user)
            reading = self._begin(user.name, now)
        try:
            # shielded: a page that stops waiting leaves the read to serve the next one
            stops = await asyncio.wait_for(asyncio.shield(reading), self.timeout)
        except TimeoutError:
            log.warning(
                "The hub's pages show no new last stops of %s: the usage database has not "
                "answered within %g s",
                user.name,
                self.timeout,
            )
            return self.cached(user)
        except Exception:
            # the page still renders; the read's own failure is logged once, when it ends
            return self.cached(user)
        return self._not_running(user, stops)

    def _begin(self, name: str, now: float) -> asyncio.Future[Stops]:
        loop = asyncio.get_running_loop()
        reading = loop.run_in_executor(self._executor, self._read, name, now)
        self._reading[name] = reading

        def done(future: asyncio.Future[Stops]) -> None:
            self._reading.pop(name, None)
            if future.cancelled() or future.exception() is not None:
                if not future.cancelled():
                    log.warning("The hub's pages show no last stops: %r", future.exception())
                return
            self._cache[name] = (now, future.result())
            if len(self._cache) > 10_000:
                self._cache = {name: self._cache[name]}

        reading.add_done_callback(done)
        return reading

    @staticmethod
    def _not_running(user: Any, stops: Stops) -> Stops:
        spawners = getattr(user, "spawners", {}) or {}
        return [
            stop
            for stop in stops
            if not (stop["server"] in spawners and spawners[stop["server"]].active)
        ]

    def _events(self) -> EventStore:
        # made in a reader thread too: opening the database is I/O
        with self._store_lock:
            if self._store is None:
                self._store = EventStore(UsageStore(self._url()))
            return self._store

    def _read(self, name: str, now: float) -> Stops:
        """In a reader thread: the user's last stops from the database."""
        try:
            stops = self._events().last_stops(now - SHOWN_FOR, user=name)
        except AccountingUnavailable as e:
            # the page still renders; the hub's log says what is wrong
            log.warning("The hub's pages show no last stops: %s", e)
            return []
        shown = []
        for (_, server), row in sorted(stops.items(), key=lambda kv: -kv[1].at):
            shown.append(
                {
                    "server": server,
                    "label": f"Your server {server!r}" if server else "Your server",
                    "reason": row.reason,
                    "text": row.message,
                    "at": words.moment(row.at),
                    "epoch": row.at,
                }
            )
        return shown


class UserStops:
    """One user's last stops as the templates iterate them: in JupyterHub's async
    rendering (its pages), read off the event loop as the loop reaches them; in a
    sync rendering (its error pages), only what was read before."""

    def __init__(self, owner: LastStops, user: Any) -> None:
        self._owner = owner
        self._user = user

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._stops()

    async def _stops(self) -> AsyncIterator[dict[str, Any]]:
        for stop in await self._owner.fresh(self._user):
            yield stop

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._owner.cached(self._user))


def show_last_stops(c: Config) -> None:
    """Add the templates and the template variable to the hub's config ``c``."""
    hub = c.JupyterHub
    theirs = list(hub.template_paths) if "template_paths" in hub else []
    if str(TEMPLATES) not in theirs:
        # after a site's own (theirs win), before JupyterHub's defaults (appended by it)
        hub.template_paths = [*theirs, str(TEMPLATES)]
    variables = dict(hub.template_vars) if "template_vars" in hub else {}

    def url() -> str:
        from ..config.policy import GPUPolicy

        return GPUPolicy(config=c).accounting_url

    variables[TEMPLATE_VAR] = LastStops(url)
    hub.template_vars = variables
