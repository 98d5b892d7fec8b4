"""Leader election on a real Lease: one replica acts, a leader that cannot renew stops
acting before another may start, a released Lease is taken at once.

Each replica here is a ``LeaseElector`` with its own API client against the local
cluster's real API server; the timings are short (lease 3 s, renew deadline 2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from kubernetes_asyncio import client

from jupyterhub_gpu.kube.leader import LeaseElector, LeaseTimings
from kube_helpers import eventually

TIMINGS = LeaseTimings(duration=3.0, renew_deadline=2.0, retry_period=0.4)
LEASE = "the-lease"


@pytest.mark.parametrize(
    ("timings", "problem"),
    [
        (LeaseTimings(10, 10, 2), "must be shorter than lease_duration"),
        (LeaseTimings(15, 12, 10), "must be shorter than lease_renew_deadline"),
        (LeaseTimings(0.5, 0.3, 0.1), "expected at least 1 second"),
    ],
)
def test_unsafe_timings_are_refused_with_the_setting_to_change(timings, problem):
    assert any(problem in e for e in timings.errors())
    with pytest.raises(ValueError, match=problem):
        LeaseElector(None, "ns", "lease", timings)  # type: ignore[arg-type]


def test_client_go_defaults_are_safe():
    assert LeaseTimings().errors() == []


class Replica:
    """One candidate, and when it started and stopped acting (monotonic)."""

    def __init__(self, api: client.ApiClient, namespace: str, identity: str) -> None:
        self.periods: list[list[float | None]] = []
        self.elector = LeaseElector(
            api,
            namespace,
            LEASE,
            TIMINGS,
            identity=identity,
            on_started=lambda: self.periods.append([time.monotonic(), None]),
            on_stopped=lambda why: self.periods[-1].__setitem__(1, time.monotonic()),
        )
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run())

    async def halt(self) -> None:
        """Stop trying (a process that hangs): nothing more is sent, nothing released."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@pytest.fixture
async def replicas(local_cluster, namespace):
    made: list[Replica] = []
    async with contextlib.AsyncExitStack() as stack:

        async def make(name: str) -> Replica:
            api = await stack.enter_async_context(local_cluster.api())
            replica = Replica(api, namespace, name)
            made.append(replica)
            return replica

        yield make
        for replica in made:
            await replica.halt()


async def lease_of(kube, namespace: str):
    return await client.CoordinationV1Api(kube).read_namespaced_lease(LEASE, namespace)


async def two_replicas(replicas) -> tuple[Replica, Replica]:
    """The first acting, then the second standing by."""
    first = await replicas("first")
    second = await replicas("second")
    first.start()
    await eventually(lambda: asyncio.sleep(0, first.elector.acting()), "the first to act", 10)
    second.start()
    return first, second


def overlap(a: list, b: list) -> float:
    """Seconds two acting periods share (an open one runs to now)."""
    now = time.monotonic()
    return min(a[1] or now, b[1] or now) - max(a[0], b[0])


@pytest.mark.k8s
async def test_one_acts_and_the_other_takes_over_within_the_lease_when_it_stops(
    replicas, kube, namespace
):
    first, second = await two_replicas(replicas)
    # a few renewals later the second still stands by
    await asyncio.sleep(TIMINGS.duration * 1.5)
    assert first.elector.acting()
    assert not second.elector.acting()
    lease = await lease_of(kube, namespace)
    assert lease.spec.holder_identity == "first"
    assert lease.spec.lease_duration_seconds == 3
    # the first hangs: it sends nothing more and gives nothing up
    await first.halt()
    halted = time.monotonic()
    await eventually(lambda: asyncio.sleep(0, second.elector.acting()), "the second to act", 15)
    took_over = second.periods[0][0]
    # within the Lease's duration after the first's last renewal (it renews every retry
    # period), with one retry period of the second's own
    assert took_over - halted <= TIMINGS.duration + 2 * TIMINGS.retry_period + 1.0
    # the first stopped acting by itself, at its renew deadline, before the second began
    stopped = first.periods[0][1]
    assert stopped is not None
    assert stopped < took_over
    assert overlap(first.periods[0], second.periods[0]) < 0
    lease = await lease_of(kube, namespace)
    assert lease.spec.holder_identity == "second"
    assert lease.spec.lease_transitions == 1


@pytest.mark.k8s
async def test_a_leader_cut_off_stops_acting_at_its_renew_deadline(replicas, namespace):
    leader = await replicas("leader")
    leader.start()
    await eventually(lambda: asyncio.sleep(0, leader.elector.acting()), "the leader to act", 10)
    await leader.halt()
    halted = time.monotonic()
    # no renewal, no answer from anyone: its own timer ends its acting, on time
    await eventually(
        lambda: asyncio.sleep(0, leader.periods[0][1] is not None), "the fence", 2 * 2.0 + 1
    )
    assert leader.periods[0][1] - halted <= TIMINGS.renew_deadline + 0.2
    assert not leader.elector.acting()
    assert leader.elector.why_not_acting() == (
        f"this replica (leader) does not hold Lease {namespace}/{LEASE}"
    )


@pytest.mark.k8s
async def test_a_released_lease_is_taken_at_the_next_retry(replicas, kube, namespace):
    first, second = await two_replicas(replicas)
    await asyncio.sleep(TIMINGS.retry_period * 2)
    await first.halt()
    await first.elector.release()
    released = time.monotonic()
    assert not first.elector.acting()
    await eventually(lambda: asyncio.sleep(0, second.elector.acting()), "the second to act", 10)
    # far sooner than the Lease's duration
    assert second.periods[0][0] - released <= 2 * TIMINGS.retry_period + 0.5


@pytest.mark.k8s
async def test_two_candidates_starting_together_never_both_act(replicas, namespace):
    many = [await replicas(f"r{i}") for i in range(3)]
    for replica in many:
        replica.start()
    await asyncio.sleep(TIMINGS.duration * 2)
    acting = [r for r in many if r.elector.acting()]
    assert len(acting) == 1
    assert sum(len(r.periods) for r in many) == 1


class SlowRenewals(LeaseElector):
    """The election's own bookkeeping on a clock the test moves: each renewal takes
    ``took`` seconds of it and succeeds (the API server's part is the tests above)."""

    def __init__(self, clock: list[float], api: client.ApiClient) -> None:
        super().__init__(
            api,
            "ns",
            LEASE,
            TIMINGS,
            identity="me",
            monotonic=lambda: clock[0],
            wall=lambda: 1_000_000 + clock[0],
            on_started=lambda: self.calls.append("started"),
            on_stopped=lambda why: self.calls.append(f"stopped: {why}"),
        )
        self.clock = clock
        self.took = 0.0
        self.calls: list[str] = []

    async def _take_or_renew(self, began: float) -> bool:
        self.clock[0] += self.took
        self.state.holder = self.identity
        return True


async def test_a_renewal_that_returns_after_the_deadline_counts_for_nothing():
    clock, api = [0.0], client.ApiClient()
    elector = SlowRenewals(clock, api)
    elector.took = TIMINGS.renew_deadline + 0.1
    assert await elector.try_once()  # it holds the Lease, but too late to act on it
    assert not elector.acting()
    assert elector.calls == []
    elector.took = 0.1
    await elector.try_once()
    assert elector.acting()
    # the next renewal comes back after the deadline the last one set: that acting ends
    # (dated at its deadline) and a new one begins only if this renewal is in time
    elector.took = TIMINGS.renew_deadline + 0.5
    await elector.try_once()
    assert not elector.acting()
    assert elector.calls == [
        "started",
        f"stopped: Lease ns/{LEASE} was not renewed within its renew deadline",
    ]
    (period,) = elector.state.periods
    # it began acting with the second renewal, sent when the first came back
    sent = TIMINGS.renew_deadline + 0.1
    assert period.until == pytest.approx(1_000_000 + sent + TIMINGS.renew_deadline)
    await api.close()
