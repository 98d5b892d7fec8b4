"""The hub's admission of spawns: one object every ``GPUKubeSpawner`` of a hub shares,
made of three parts each testable alone:

- the ledger of charges, rebuilt from pod labels and resynced against the pods
  (``ledger_keeper.LedgerKeeper``; ``core.admission.Ledger`` is its arithmetic);
- the usage recorder: each GPU server's start and end written to the usage database,
  and the book budgets and fair share are checked against (``usage_recorder``);
- the waiting line of ``when_full: wait`` (``waiting_line``).

``SpawnAdmission.admit`` is where they meet: a server's budget check, its charge and
its place in the line are decided in one synchronous step. The spawner supplies what
only it can do (list the charged pods, with its Kubernetes client and namespaces).
The deletions still finishing after failed stops are kept here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ..accounting.backlog import AccountingLag
from ..core.admission import Charge, Decision, Ledger
from ..core.budgets import BudgetState
from ..core.dra import DraInventory
from ..core.fairshare import FairShareBook, Place, Waiter
from ..core.line import Line
from ..core.model import Group, Policy
from ..core.selection import Request
from .ledger_keeper import LedgerKeeper, ListCharges
from .usage_recorder import BUDGETS_UNCHECKED, UsageRecorder
from .waiting_line import ORDER_KEPT, STANDINGS_PER_TURN, WaitingLine, wait_message

__all__ = [
    "BUDGETS_UNCHECKED",
    "ORDER_KEPT",
    "REFUSED_BUDGET",
    "REFUSED_USAGE_DATABASE",
    "STANDINGS_PER_TURN",
    "AccountingCollector",
    "ListCharges",
    "SpawnAdmission",
    "register_hub_metrics",
]

#: why a budget refused a spawn, in one word (the hub counts refused spawns by it)
REFUSED_BUDGET = "budget"
REFUSED_USAGE_DATABASE = "usage_database"


def _shared(part: str, name: str) -> property:
    """An attribute of one of the parts, read and set through the admission."""

    def get(self: SpawnAdmission) -> Any:
        return getattr(getattr(self, part), name)

    def put(self: SpawnAdmission, value: Any) -> None:
        setattr(getattr(self, part), name, value)

    return property(get, put, doc=f"``{part}.{name}``")


class SpawnAdmission:
    """The ledger every spawn is admitted against, the usage it is checked against, and
    the line it waits in."""

    def __init__(self, log: logging.Logger | None = None, *, loaded: bool = False) -> None:
        self.log = log or logging.getLogger("jupyterhub_gpu")
        self.clock: Callable[[], float] = time.time
        # the parts ask the admission's clock, which tests and the offline runner set
        now = lambda: self.clock()  # noqa: E731
        self.recorder = UsageRecorder(self.log, now, self.finish_in_background, loaded=loaded)
        self.keeper = LedgerKeeper(self.log, now, self.recorder, loaded=loaded)
        self.waiting_line = WaitingLine(now)
        #: deletions of pods whose stop failed, retried until the pod is gone
        self.finishing: set[asyncio.Future] = set()
        #: server pods started before the policy that were running at the last listing
        #: (rebuild or resync): while there are any, new servers do not preempt
        self.servers_before_policy = 0

    # the parts' state, as the spawner, the hub's pages and the tests read it
    ledger: Ledger = _shared("keeper", "ledger")
    loaded: bool = _shared("keeper", "loaded")
    starting: set[str] = _shared("keeper", "starting")
    touched: dict[str, float] = _shared("keeper", "touched")
    line: Line = _shared("waiting_line", "line")
    usage = _shared("recorder", "usage")
    fair: FairShareBook | None = _shared("recorder", "fair")
    store = _shared("recorder", "store")
    fail_open: bool = _shared("recorder", "fail_open")
    backlog = _shared("recorder", "backlog")
    retry_max: float = _shared("recorder", "retry_max")
    usage_loaded: bool = _shared("recorder", "usage_loaded")
    usage_error: str | None = _shared("recorder", "usage_error")
    usage_failing_since: float | None = _shared("recorder", "usage_failing_since")
    usage_read_at: float | None = _shared("recorder", "usage_read_at")
    _retrying: asyncio.Task | None = _shared("recorder", "_retrying")

    @classmethod
    def empty_cluster(cls) -> SpawnAdmission:
        """An admission that knows no servers and reads nothing from Kubernetes: what
        ``jupyterhub-gpu profiles`` and ``pod`` assume."""
        return cls(loaded=True)

    @property
    def changed(self) -> asyncio.Condition:
        """Notified whenever a charge is released (created in the running loop)."""
        return self.keeper.changed

    # ---- the ledger -------------------------------------------------------------------

    async def ready_ledger(
        self, policy: Policy, list_charges: ListCharges, resync_interval: float
    ) -> Ledger:
        """The ledger, rebuilt from pod labels the first time it is needed."""
        return await self.keeper.ready(policy, list_charges, resync_interval)

    def begin_rebuild(
        self, policy: Policy, list_charges: ListCharges, resync_interval: float
    ) -> asyncio.Future:
        """The rebuild of the ledger under way, started unless one is."""
        return self.keeper.begin_rebuild(policy, list_charges, resync_interval)

    def start_ended(self, key: str) -> None:
        """The start of ``key`` finished (its pod exists) or failed."""
        self.keeper.start_ended(key)

    async def release(self, policy: Policy, key: str, only: Charge | None = None) -> None:
        """Free the charge of ``key`` (its pod is gone); with ``only``, just that charge."""
        await self.keeper.release(policy, key, only)

    def charge(self, key: str) -> Charge | None:
        return self.keeper.charge(key)

    # ---- GPU time -----------------------------------------------------------------------

    def use_store(self, store: Any, fail_open: bool) -> None:
        """Record GPU time in ``store`` and check budgets against what it holds."""
        self.recorder.use_store(store, fail_open)

    @property
    def usage_current(self) -> bool:
        """Budgets can be checked: the usage was read, and nothing failed since."""
        return self.recorder.usage_current

    async def read_usage(self, policy: Policy) -> None:
        """Write what is kept, then bring the usage book up to date with the database."""
        await self.recorder.read_usage(policy)

    def accounting(self) -> AccountingLag:
        """How far the usage database is behind what this hub has seen."""
        return self.recorder.accounting()

    def record_start(
        self, policy: Policy, pod: dict[str, Any], dra: DraInventory | None = None
    ) -> None:
        """A GPU server's pod started: count it from its start, and write it down."""
        self.recorder.record_start(policy, pod, dra)

    def count_usage(self, policy: Policy, record: Any) -> None:
        """Put a usage record in the budgets' book and, with fair share, the standings'."""
        self.recorder.count_usage(policy, record)

    def record_stop(
        self, key: str, at: float | None = None, *, uid: str | None = None, inferred: bool = False
    ) -> None:
        """A pod of the server ``key`` is gone (now, or ``at``): its GPU time ends
        (``UsageRecorder.record_stop``)."""
        self.recorder.record_stop(key, at, uid=uid, inferred=inferred)

    def budget_refusal(
        self, policy: Policy, user: str, group: Group, request: Request
    ) -> str | None:
        """Why a GPU budget forbids this server now, or None."""
        return self.recorder.budget_refusal(policy, user, group, request, self.ledger)

    def budgets(self, policy: Policy, user: str, group: Group) -> list[BudgetState]:
        """The budgets a GPU server of ``user`` in ``group`` would count against, now."""
        return self.recorder.budgets(policy, user, group, self.ledger.charges)

    def usable_again(self, states: list[BudgetState]) -> float | None:
        """When every used-up budget of ``states`` has room again (None: not known)."""
        return self.recorder.usable_again(states, self.ledger.charges)

    def burst_band(self, policy: Policy, user: str, group: str) -> str | None:
        """With fair share, the band of a server of ``user`` bursting above ``group``'s
        quota; None without it."""
        return self.recorder.burst_band(policy, user, group, self.ledger.charges)

    def fair_book(self, policy: Policy) -> FairShareBook:
        """The fair-share standings (``policy`` has ``fair_share``)."""
        return self.recorder.fair_book(policy)

    # ---- admitting and waiting --------------------------------------------------------

    async def admit(
        self,
        policy: Policy,
        key: str,
        user: str,
        group: Group,
        request: Request,
        *,
        show_wait: Callable[[str | None], None],
        poll_interval: float,
    ) -> Decision:
        """Admit or refuse the server ``key``, waiting in line while the decision is
        "wait". ``show_wait`` is told the line position to show (None when the wait is
        over); ``poll_interval`` bounds each wait for a release that happened elsewhere
        (another hub replica, a pod an admin removed).

        Only a server with nobody ahead of it in the line that waits for capacity it
        needs too (``core.fairshare.place``) is decided; the others wait their turn."""
        now = self.clock()
        me = self.waiting_line.waiter(policy, key, user, group, now)
        self.join_line(policy, me, now)
        show_wait(None)
        try:
            while True:
                reason = None
                where = self.place(policy, me, self.clock())
                if not where.ahead:
                    # check and reserve happen in this one synchronous step: atomic
                    over_budget = self.budget_refusal(policy, user, group, request)
                    if over_budget:
                        unchecked = over_budget == BUDGETS_UNCHECKED
                        kind = REFUSED_USAGE_DATABASE if unchecked else REFUSED_BUDGET
                        return Decision("refuse", reason=over_budget, kind=kind)
                    decision = self.ledger.admit(policy, key, user, group, request)
                    if decision.admitted:
                        self.keeper.admitted(key)
                    if decision.outcome != "wait":
                        return decision
                    reason = decision.reason
                    self.line.block(me, decision.level or group.name)
                elif me.blocked_on is None:
                    # it waits for what the first ahead of it waits for
                    self.line.block(me, where.ahead[0].blocked_on)
                now = self.clock()
                where = self.place(policy, me, now)
                show_wait(wait_message(policy, group, me, where, reason, now))
                async with self.changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.changed.wait(), poll_interval)
        finally:
            self.line.leave(me)
            show_wait(None)

    def join_line(self, policy: Policy, me: Waiter, now: float) -> None:
        """``me`` joins the line; with fair share, with its standing worked out for the
        moment every other waiter's was (``WaitingLine.join``)."""
        standing = None
        if policy.fair_share is not None:

            def standing(user: str, group: str, at: float) -> tuple[float, ...]:
                book = self.fair_book(policy)
                return book.order_key(user, group, at, self.ledger.charges)

        self.waiting_line.join(policy, me, now, standing)

    def place(self, policy: Policy, me: Waiter, now: float) -> Place:
        """``me``'s place in the line now, among those waiting for the same capacity."""
        return self.waiting_line.place(policy, me, now)

    @property
    def waiting(self) -> dict[str, deque[str]]:
        """Group -> the keys of its servers waiting, in the order they go."""
        return self.waiting_line.by_group(self.recorder.policy)

    def finish_in_background(self, work: Awaitable[None]) -> None:
        """Keep a deletion that outlives its stop running (and referenced) to its end."""
        task = asyncio.ensure_future(work)
        self.finishing.add(task)
        task.add_done_callback(self.finishing.discard)


class AccountingCollector:
    """The hub's side of GPU usage accounting as Prometheus metrics, for the hub's own
    ``/hub/metrics``: register it once with the shared admission,
    ``prometheus_client.REGISTRY.register(AccountingCollector(admission))``."""

    PREFIX = "jupyterhub_gpu_hub_accounting"

    def __init__(self, admission: SpawnAdmission) -> None:
        self.admission = admission

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        lag, now = self.admission.accounting(), self.admission.clock()
        gauges = [
            (
                "up",
                "1 when the usage database was last written and read, 0 while it fails",
                1.0 if lag.ok else 0.0,
            ),
            (
                "unwritten_servers",
                "servers whose starts or ends are kept, not written yet",
                lag.unwritten,
            ),
            (
                "oldest_unwritten_age_seconds",
                "age of the oldest start or end not written yet (0: none)",
                0.0 if lag.oldest_unwritten is None else max(now - lag.oldest_unwritten, 0.0),
            ),
            (
                "last_write_timestamp_seconds",
                "when the usage database was last written",
                lag.last_write,
            ),
            ("last_read_timestamp_seconds", "when the usage database was last read", lag.last_read),
        ]
        for name, help_text, value in gauges:
            if value is not None:
                yield GaugeMetricFamily(f"{self.PREFIX}_{name}", help_text, value=float(value))
        yield CounterMetricFamily(
            f"{self.PREFIX}_dropped_events",
            "starts and ends dropped because what was kept was full",
            value=lag.dropped,
        )


def register_hub_metrics(admission: SpawnAdmission) -> None:
    """Show the hub's side of GPU-hour accounting on the hub's own ``/hub/metrics``."""
    import prometheus_client

    with contextlib.suppress(ValueError):  # already registered by an earlier hub in-process
        prometheus_client.REGISTRY.register(AccountingCollector(admission))
