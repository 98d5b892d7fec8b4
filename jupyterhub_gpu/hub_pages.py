"""The hub's home and spawn pages say why each of the user's servers last stopped.

The GPU service records every stop with its reason in the usage database
(``accounting.events``): its own (idle, budget, max_runtime, over its limit) and
those nobody scheduled (a preemption, an eviction, a stop through the hub). The
hub reads the user's last stops from the same database when it renders these two
pages, through JupyterHub's own extension points: ``template_vars`` (a callable,
given the user) and two templates in ``template_paths`` that extend JupyterHub's
own (``templates/home.html``, ``templates/spawn.html``) by a block above the page's
content, so a site's own templates, listed first, still win.

``show_last_stops(c)`` sets both; the hub image's ``jupyterhub_config.d`` file calls
it (z2jh), as may a plain ``jupyterhub_config.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from traitlets.config import Config

from .accounting.events import EventStore
from .accounting.store import AccountingUnavailable, UsageStore

log = logging.getLogger("jupyterhub_gpu.hub_pages")

TEMPLATES = Path(__file__).parent / "templates"
#: the name the templates read
TEMPLATE_VAR = "gpu_last_stops"
#: stops older than this are not shown (seconds)
SHOWN_FOR = 7 * 86400
#: a user's stops are read again at most this often (seconds): a page reload is no query
CACHE_FOR = 5.0


class LastStops:
    """The callable ``template_vars`` entry: a user's servers' last stops, for servers
    not running now, newest first, as dicts the templates show."""

    def __init__(self, url: Callable[[], str], clock: Callable[[], float] = time.time) -> None:
        self._url = url
        self._store: EventStore | None = None
        self.clock = clock
        self._cache: dict[str, tuple[float, list[dict[str, Any]]]] = {}

    def __call__(self, user: Any) -> list[dict[str, Any]]:
        if user is None:
            return []
        now = self.clock()
        cached = self._cache.get(user.name)
        if cached is None or now - cached[0] > CACHE_FOR:
            cached = (now, self._read(user.name, now))
            self._cache[user.name] = cached
            if len(self._cache) > 10_000:
                self._cache = {user.name: cached}
        spawners = getattr(user, "spawners", {}) or {}
        return [
            stop
            for stop in cached[1]
            if not (stop["server"] in spawners and spawners[stop["server"]].active)
        ]

    def _read(self, name: str, now: float) -> list[dict[str, Any]]:
        if self._store is None:
            self._store = EventStore(UsageStore(self._url()))
        try:
            stops = self._store.last_stops(now - SHOWN_FOR, user=name)
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
                    "at": datetime.fromtimestamp(row.at, UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    "epoch": row.at,
                }
            )
        return shown


def show_last_stops(c: Config) -> None:
    """Add the templates and the template variable to the hub's config ``c``."""
    hub = c.JupyterHub
    theirs = list(hub.template_paths) if "template_paths" in hub else []
    if str(TEMPLATES) not in theirs:
        # after a site's own (theirs win), before JupyterHub's defaults (appended by it)
        hub.template_paths = [*theirs, str(TEMPLATES)]
    variables = dict(hub.template_vars) if "template_vars" in hub else {}

    def url() -> str:
        from .config.policy import GPUPolicy

        return GPUPolicy(config=c).accounting_url

    variables[TEMPLATE_VAR] = LastStops(url)
    hub.template_vars = variables
