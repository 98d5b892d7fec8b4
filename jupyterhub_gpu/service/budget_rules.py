"""Used-up budgets and the servers still running on them.

When a budget a running GPU server counts against is used up (its group's, a
parent's, or its user's own in the group), the server's user is told, on the
dashboard and in the log, once per budget: each notice names its budget and its
numbers. A ``when_exhausted: warn`` budget's notice is all it does: the server
runs on, and new GPU servers are refused at the hub. A ``when_exhausted: stop``
budget's notice says when the server stops, ``grace`` after that notice; the
server stops at the earliest stop announced for a budget still used up, never
earlier (``core.budgets.budget_notices`` decides). A budget with room again is
forgotten, and a later exhaustion is told anew. Read from the GPU-time snapshot
(computed once per pass), not per server.

What was told (per server pod and budget: when, and the stop announced) is kept
in the usage database (``accounting.events.BudgetToldStore``) and read back at
every run, so a restarted service neither tells a server again with a fresh
grace nor forgets the stop it announced: a service that restarts in a loop still
stops the server at the announced time. The row is written before the notice is
given: a notice is never given that a restart would forget.

Only numbers just read count: while the usage database cannot be written or
read, nobody is told and nothing is stopped on the last numbers read (the task
fails, saying so, at its interval); a stop that fell due meanwhile happens at
the first run after the database is back, if the budget is still used up then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime

from ..accounting.events import BudgetToldStore, ToldRow
from ..core import words
from ..core.budgets import BudgetKey, Told, UsedUp, budget_notices, earliest_stop, used_line
from ..core.model import Policy
from .gpu_time import GPUTime
from .runtime_rules import StopServer
from .state import ServerPod, ServiceState
from .tasks import RetryAtInterval
from .views import Notice, server_label

#: a pass's result before the GPU-hours are first read: nobody is told or stopped yet
NOT_READ_YET = "GPU-hours not read yet"


class BudgetsNotApplied(RetryAtInterval):
    """The GPU-hours could not be refreshed: no one is told or stopped on stale ones."""


class ToldInMemory:
    """``BudgetToldStore``'s reads and writes, kept in this process only (a service
    without a usage database to keep them in; tests of the rule alone)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, BudgetKey], ToldRow] = {}

    def read(self) -> list[ToldRow]:
        return list(self.rows.values())

    def write(
        self,
        tell: Iterable[ToldRow],
        forget: Iterable[tuple[str, BudgetKey]],
        forget_pods: Iterable[str],
        stop_said: Iterable[tuple[str, BudgetKey, float]],
    ) -> set[tuple[str, BudgetKey]]:
        for key in forget:
            self.rows.pop(key, None)
        gone = set(forget_pods)
        self.rows = {k: r for k, r in self.rows.items() if k[0] not in gone}
        added = set()
        for row in tell:
            key = (row.pod, row.told.key)
            if key not in self.rows:
                self.rows[key] = row
                added.add(key)
        for pod, budget, at in stop_said:
            row = self.rows.get((pod, budget))
            if row is not None:
                told = row.told
                self.rows[(pod, budget)] = ToldRow(
                    row.pod, row.user, row.server, Told(told.key, told.at, told.stop_at, at)
                )
        return added


def pod_id(pod: ServerPod) -> str:
    """Which server pod a told budget is about: its uid (a server started again is a
    new pod, told anew), or its namespace/name for a pod without one."""
    return pod.uid or pod.key


def clock_text(epoch: float) -> str:
    return words.moment(epoch)


class BudgetRule:
    def __init__(
        self,
        policy: Policy,
        state: ServiceState,
        gpu_time: GPUTime,
        stop: StopServer,
        store: BudgetToldStore | None = None,
    ) -> None:
        self.policy = policy
        self.state = state
        self.gpu_time = gpu_time
        self.stop = stop
        #: where what was told is kept (None: in this process only)
        self.store: BudgetToldStore | ToldInMemory = store if store is not None else ToldInMemory()
        #: pod key -> budget -> what its server was told, as of the last run (for the
        #: server's stops ahead, ``scheduled_stop``)
        self.told: dict[str, dict[BudgetKey, Told]] = {}
        #: budget -> words for its owner, as the last run named them
        self._owners: dict[BudgetKey, str] = {}

    def exhausted(self, pod: ServerPod) -> list[UsedUp]:
        """Each used-up budget this server counts against, nearest first."""
        snapshot = self.gpu_time.snapshot
        charge = pod.charge
        group = self.policy.find_group(charge.group) if charge else None
        if charge is None or group is None or not charge.request.gpus:
            return []
        if pod.before_policy is not None:
            return []  # started before the policy: its GPU time counts, it is never stopped
        found = []
        for level in self.policy.ancestors(group.name):
            hours = snapshot.groups.get(level.name)
            if level.budget and hours is not None and hours.exhausted:
                found.append(UsedUp((level.name, ""), level.display_name, level.budget, hours.used))
        hours = snapshot.users.get((charge.user, group.name))
        if group.user_budget and hours is not None and hours.exhausted:
            found.append(
                UsedUp(
                    (group.name, charge.user),
                    f"{charge.user} in {group.display_name}",
                    group.user_budget,
                    hours.used,
                )
            )
        return found

    def owner(self, key: BudgetKey) -> str:
        """Words for a budget's owner: "research", or "alice in research"."""
        if key in self._owners:
            return self._owners[key]
        group_name, member = key
        group = self.policy.find_group(group_name)
        name = group.display_name if group is not None else group_name
        return f"{member} in {name}" if member else name

    def scheduled_stop(self, pod: ServerPod) -> tuple[float, str] | None:
        """(when, whose budget) of the stop announced for this server, or None."""
        stop = earliest_stop(self.told.get(pod.key, {}).values())
        if stop is None or stop.stop_at is None:
            return None
        return stop.stop_at, self.owner(stop.key)

    async def follow(self) -> str:
        """What servers were told, as the acting replica wrote it (their scheduled stops,
        for the views), on a replica that does not act: nobody is told or stopped here."""
        by_id = {pod_id(p): p for p in (self.state.server_pods or {}).values()}
        told: dict[str, dict[BudgetKey, Told]] = {}
        for row in await asyncio.to_thread(self.store.read):
            pod = by_id.get(row.pod)
            if pod is not None:
                told.setdefault(pod.key, {})[row.told.key] = row.told
        self.told = told
        return f"{len(told)} server(s) over a budget"

    async def run(self) -> str:
        pods = self.state.server_pods
        if pods is None:
            raise RuntimeError("server pods not listed yet (see the watch server pods task)")
        now = self.gpu_time.clock()
        snapshot = self.gpu_time.snapshot
        if snapshot.error is not None:
            read = (
                "never read"
                if snapshot.read_at is None
                else f"last read at {clock_text(snapshot.read_at)}"
            )
            raise BudgetsNotApplied(
                f"no server told or stopped: the GPU-hours could not be refreshed ({read}; "
                f"{snapshot.error})"
            )
        if snapshot.read_at is None:
            return NOT_READ_YET
        rows = await asyncio.to_thread(self.store.read)
        told_of: dict[str, dict[BudgetKey, ToldRow]] = {}
        for row in rows:
            told_of.setdefault(row.pod, {})[row.told.key] = row
        here = {pod_id(p) for p in pods.values()}
        forget_pods = [pid for pid in told_of if pid not in here]
        tell: list[ToldRow] = []
        forget: list[tuple[str, BudgetKey]] = []
        stop_said: list[tuple[str, BudgetKey, float]] = []
        plans = []  # (pod, what it counts against, the decision)
        for pod in pods.values():
            pid = pod_id(pod)
            used = self.exhausted(pod) if pod.user is not None else []
            told = [r.told for r in told_of.get(pid, {}).values()]
            if not used and not told:
                continue
            for u in used:
                self._owners[u.key] = u.owner
            decision = budget_notices(used, told, now)
            forget += [(pid, key) for key in decision.forget]
            tell += [ToldRow(pid, pod.user or "", pod.servername, t) for t in decision.tell]
            stop = decision.stop
            if decision.due and stop is not None and not any(t.stop_said for t in told):
                stop_said.append((pid, stop.key, now))
            plans.append((pod, used, decision))
        if tell or forget or forget_pods or stop_said:
            added = await asyncio.to_thread(self.store.write, tell, forget, forget_pods, stop_said)
        else:
            added = set()
        said = {(pid, key) for pid, key, _ in stop_said}
        self.told = {}
        due: list[ServerPod] = []
        for pod, used, decision in plans:
            pid = pod_id(pod)
            kept = {
                key: row.told
                for key, row in told_of.get(pid, {}).items()
                if key not in decision.forget
            }
            new = [t for t in decision.tell if (pid, t.key) in added]
            kept.update((t.key, t) for t in new)
            if kept:
                self.told[pod.key] = kept
            words = {u.key: u for u in used}
            for t in new:
                self._tell(pod, words[t.key], t, earliest_stop(kept.values()))
            stop = decision.stop
            if decision.due and stop is not None and stop.key in kept:
                due.append(pod)
                if (pid, stop.key) in said:
                    self._say_stop(pod, words[stop.key], stop)
        results = await asyncio.gather(
            *(self.stop(p.user or "", p.servername, "budget", p) for p in due)
        )
        errors = [r for r in results if r]
        if errors:
            raise RuntimeError(f"{len(errors)} stop(s) failed; first: {errors[0]}")
        return f"{len(self.told)} server(s) over a budget, {len(due)} stopped"

    def _notice(self, pod: ServerPod, text: str, kind: str, stop_at: float | None = None) -> None:
        now = self.gpu_time.clock()
        self.state.notice(
            Notice(
                at=datetime.fromtimestamp(now, UTC),
                text=text,
                group=pod.charge.group if pod.charge else None,
                user=pod.user,
                server=pod.servername,
                uid=pod.uid,
                kind=kind,
                stop_at=None if stop_at is None else datetime.fromtimestamp(stop_at, UTC),
            )
        )

    def _tell(self, pod: ServerPod, used_up: UsedUp, told: Told, first: Told | None) -> None:
        """The notice of one used-up budget: its numbers, and what it does to the server."""
        other = first if first is not None and first.key != told.key else None
        earlier = None
        if other is not None and other.stop_at is not None:
            earlier = (other.stop_at, self.owner(other.key))
        text = budget_notice_text(
            server_label(pod.user or "", pod.servername),
            used_line(used_up.owner, used_up.used, used_up.budget),
            told,
            earlier,
        )
        self._notice(pod, text, "budget", told.stop_at)

    def _say_stop(self, pod: ServerPod, used_up: UsedUp, stop: Told) -> None:
        self._notice(
            pod,
            budget_stop_text(
                server_label(pod.user or "", pod.servername),
                used_line(used_up.owner, used_up.used, used_up.budget),
                stop,
            ),
            "budget_stop",
        )


# ---- what users are told ------------------------------------------------------------


def budget_notice_text(
    server: str, used: str, told: Told, other: tuple[float, str] | None = None
) -> str:
    """The notice of a used-up budget a running server counts against: ``used`` (its
    numbers, ``used_line``), and what it does to the server; ``other``: the stop another
    used-up budget announced for it already (when, and whose budget)."""
    whose = f"{server}'s server"
    if told.stop_at is None:
        then = "new GPU servers are refused until some of it is free again; "
        if other is not None:
            then += (
                f"this budget does not stop {whose}, which stops at {words.moment(other[0])} "
                f"as the used-up budget of {other[1]} said"
            )
        else:
            then += f"{whose} keeps running"
    else:
        grace = words.duration(told.stop_at - told.at)
        then = f"{whose} stops at {words.moment(told.stop_at)}, in {grace}: save your work"
        if other is not None and other[0] < told.stop_at:
            then += (
                f"; it already stops earlier, at {words.moment(other[0])}, as the used-up "
                f"budget of {other[1]} said"
            )
    return f"GPU budget used up: {used}; {then}"


def budget_stop_text(server: str, used: str, stop: Told) -> str:
    """The notice of a server stopped for a used-up budget, its grace over."""
    grace = words.duration((stop.stop_at or stop.at) - stop.at)
    return (
        f"Stopping {server}'s server: {used}, and the {grace} it had after the notice at "
        f"{words.moment(stop.at)} are over"
    )
