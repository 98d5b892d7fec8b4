"""The service's background work: named loops that never crash, back off and report.

Every periodic job (the runtime rules, the hub poller, the reconciler the lead
plugs in) and every long-running watch is a ``BackgroundTask``: an exception
is logged, counted and shown on the page (admins) with the time of the last
success, and the next attempt waits ``interval * 2**failures`` (capped at
``max_backoff``, with jitter so replicas do not retry in step). A success
resets the backoff. A job that must keep its pace through failures (it records
what it sees meanwhile) raises ``RetryAtInterval``: counted and shown like any
failure, and run again at its interval. Nothing a task raises stops the other
tasks or the web server.

Plugging in another periodic job::

    service.add_periodic("reconcile", lambda: reconciler.reconcile(policy), interval=60)

The callable may be sync or async; what it returns (e.g. a report) is kept as
``last_result`` and its ``str`` shown on the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("jupyterhub_gpu.service")


class RetryAtInterval(Exception):
    """A failure after which the job still runs at its interval, without backing off:
    it keeps doing what it can (e.g. recording what it sees until a database is back)."""


#: a URL's user and password (``postgresql://hub:secret@db/...``): the password never
#: goes to the log or the page, whatever library wrote the message
_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]*@")
#: any URL (a database's names its host, port and user)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s)'\"]+")
#: what a failing task that names the usage database says to a viewer who is not a hub admin
DATABASE_TASK_ERROR = (
    "the GPU usage database cannot be read or written now; a hub admin sees why on this page"
)


#: a connection string's password (``host=db user=gpu password=secret``)
_PASSWORD_PAIR = re.compile(
    r"(?i)\b(password|passwd|pwd)(\s*[=:]\s*)('[^']*'|\"[^\"]*\"|[^\s,;)]+)"
)


def redact_credentials(text: str) -> str:
    """``text`` with every URL's and connection string's password replaced by ``***``."""
    text = _CREDENTIALS.sub(r"\g<scheme>\g<user>:***@", text)
    return _PASSWORD_PAIR.sub(r"\1\2***", text)


def error_for_viewer(error: str | None, hub_admin: bool) -> str | None:
    """A task's error as a viewer may read it: a hub admin the whole text (no password
    is ever in it); anyone else (a group's admins, a billing job's token) no database
    error at all, which names the database's host and user, and no URL."""
    if error is None or hub_admin:
        return error
    if "database" in error or "sqlalchemy" in error.lower():
        return DATABASE_TASK_ERROR
    return _URL.sub("(a URL an admin can see)", error)


def describe_error(error: BaseException) -> str:
    """One line naming what failed, for the page and the log (no password in it)."""
    status = getattr(error, "status", None) or getattr(error, "code", None)
    reason = getattr(error, "reason", None)
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = redact_credentials(text)
    if status is not None:
        hint = {
            401: "the token was refused",
            403: "permission denied: grant the RBAC / scopes the docs list",
            404: "not found",
            409: "conflict: will retry",
            410: "the watch expired: listing again",
        }.get(int(status), "")
        detail = text or reason or ""
        return f"HTTP {status} {hint} ({type(error).__name__}: {detail[:300]})".strip()
    return f"{type(error).__name__}: {text[:300]}"


@dataclass
class TaskStatus:
    name: str
    interval: float
    runs: int = 0
    failures: int = 0  # consecutive
    last_success: datetime | None = None
    last_error: str | None = None
    last_error_at: datetime | None = None
    last_result: str | None = None
    next_run_in: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.failures == 0 and self.last_success is not None,
            "runs": self.runs,
            "consecutive_failures": self.failures,
            "last_success": self.last_success.isoformat() if self.last_success else None,
            "last_success_epoch": self.last_success.timestamp() if self.last_success else None,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at.isoformat() if self.last_error_at else None,
            "last_result": self.last_result,
        }


def backoff_delay(interval: float, failures: int, max_backoff: float) -> float:
    """Seconds to wait after ``failures`` consecutive failures (0: the normal interval)."""
    if failures <= 0:
        return interval
    base = min(interval * 2 ** min(failures, 30), max_backoff)
    return max(base * random.uniform(0.8, 1.2), 0.05)


class BackgroundTask:
    """Runs ``job`` every ``interval`` seconds (or, with ``forever``, re-runs it when it ends)."""

    def __init__(
        self,
        name: str,
        job: Callable[[], Any | Awaitable[Any]],
        interval: float,
        max_backoff: float = 300.0,
        forever: bool = False,
    ) -> None:
        self.name = name
        self.job = job
        self.interval = interval
        self.max_backoff = max(max_backoff, interval)
        self.forever = forever
        self.status = TaskStatus(name=name, interval=interval)
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"jupyterhub-gpu {self.name}")

    def wake(self) -> None:
        """Run again now (e.g. new data arrived) instead of at the next interval."""
        self._wake.set()

    def cancel(self) -> None:
        """Stop at once, wherever the job is (a replica that stops acting); ``start``
        runs it again from the beginning."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def succeeded(self, result: Any = None) -> None:
        """For watch loops: mark a healthy state without ending the job."""
        self.status.failures = 0
        self.status.last_success = datetime.now(UTC)
        if result is not None:
            self.status.last_result = str(result)

    async def run_once(self) -> Any:
        result = self.job()
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _loop(self) -> None:
        while True:
            started = time.monotonic()
            self.status.runs += 1
            at_interval = False
            try:
                result = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.status.failures += 1
                self.status.last_error = describe_error(e)
                self.status.last_error_at = datetime.now(UTC)
                log.warning(
                    "%s failed (%d in a row): %s",
                    self.name,
                    self.status.failures,
                    self.status.last_error,
                )
                log.debug("%s traceback", self.name, exc_info=True)
                at_interval = isinstance(e, RetryAtInterval)
            else:
                self.succeeded(result)
            failures = 0 if at_interval else self.status.failures
            delay = backoff_delay(self.interval, failures, self.max_backoff)
            if self.forever and self.status.failures == 0:
                # a watch that ended cleanly (server timeout): resume at once
                delay = 0
            delay = max(delay - (time.monotonic() - started), 0) if not self.forever else delay
            self.status.next_run_in = delay
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
