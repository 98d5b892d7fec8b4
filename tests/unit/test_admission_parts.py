"""The hub's admission in its three parts, each alone: the ledger keeper (rebuilt and
resynced from the pods), the usage recorder (GPU time written and read back, budgets
checked on it) and the waiting line. ``SpawnAdmission`` joins them; the spawner's
tests drive it whole."""

from __future__ import annotations

import asyncio
import logging
from fractions import Fraction

from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.admission import IN_QUOTA, Charge, Ledger
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.selection import Request
from jupyterhub_gpu.core.usage import UsageRecord
from jupyterhub_gpu.hub.ledger_keeper import LedgerKeeper
from jupyterhub_gpu.hub.usage_recorder import BUDGETS_UNCHECKED, UsageRecorder
from jupyterhub_gpu.hub.waiting_line import WaitingLine, wait_message

LOG = logging.getLogger("test")
NOW = 1_800_000_000.0
H = 3600.0
POLICY = parse_policy(
    flavors={"g": {"kind": "gpu"}},
    profiles={"p": {"gpu": {"flavor": "g"}}},
    groups={
        "lab": {
            "quota": {"gpus": 2},
            "profiles": ["p"],
            "budget": {"gpu_hours": 10, "period": "30d", "when_exhausted": "stop"},
        }
    },
)
LAB = POLICY.find_group("lab")
ONE_GPU = Request(gpus=Fraction(1), devices=(("g", 1),))


def charge(key: str, user: str = "ann") -> Charge:
    return Charge(key, user, "lab", ONE_GPU, IN_QUOTA)


def record(uid: str, key: str, started: float, gpus: float = 1.0) -> UsageRecord:
    return UsageRecord(uid, key, "ann", "lab", "p", "g", gpus, started, started)


def background(tasks: set) -> object:
    def run(work):
        task = asyncio.ensure_future(work)
        tasks.add(task)

    return run


# ---- the usage recorder ---------------------------------------------------------------


def recorder(tmp_path, clock: list[float]) -> tuple[UsageRecorder, set]:
    tasks: set = set()
    part = UsageRecorder(LOG, lambda: clock[0], background(tasks))
    part.use_store(UsageStore(f"sqlite:///{tmp_path}/usage.sqlite"), fail_open=False)
    return part, tasks


async def test_the_recorder_refuses_budgeted_spawns_until_its_first_read_then_checks_them(
    tmp_path,
):
    clock = [NOW]
    part, _ = recorder(tmp_path, clock)
    ledger = Ledger()
    # not read yet: never admitted on numbers it does not have
    assert part.budget_refusal(POLICY, "ann", LAB, ONE_GPU, ledger) == BUDGETS_UNCHECKED
    await part.read_usage(POLICY)
    assert part.usage_current
    assert part.budget_refusal(POLICY, "ann", LAB, ONE_GPU, ledger) is None
    # 12 GPU-hours used in the period: the 10-hour budget refuses, with its numbers
    part.count_usage(POLICY, record("u1", "ns/jupyter-ann", NOW - 14 * H))
    part.record_stop("ns/jupyter-ann", at=NOW - 2 * H)
    refusal = part.budget_refusal(POLICY, "ann", LAB, ONE_GPU, ledger)
    assert refusal is not None
    assert "10" in refusal
    assert "12" in refusal


async def test_the_recorders_end_of_a_server_is_written_and_read_back(tmp_path):
    clock = [NOW]
    part, tasks = recorder(tmp_path, clock)
    await part.read_usage(POLICY)
    part.count_usage(POLICY, record("u1", "ns/jupyter-ann", NOW - H))
    part.backlog.add("u1", record=record("u1", "ns/jupyter-ann", NOW - H))
    part.record_stop("ns/jupyter-ann", at=NOW, uid="u1")
    await asyncio.gather(*tasks)
    # a second hub's recorder reads what the first wrote
    again, _ = recorder(tmp_path, clock)
    await again.read_usage(POLICY)
    (ended,) = again.usage.records.values()
    assert (ended.uid, ended.ended) == ("u1", NOW)


# ---- the ledger keeper -------------------------------------------------------------------


class Pods:
    """The charges on the pods, as the spawner's listing returns them."""

    def __init__(self, *charges: Charge) -> None:
        self.charges = list(charges)
        self.calls = 0

    async def __call__(self, policy) -> list[Charge]:
        self.calls += 1
        await asyncio.sleep(0)
        return list(self.charges)


async def test_the_keeper_rebuilds_once_for_every_spawn_awaiting_it():
    clock = [NOW]
    usage = UsageRecorder(LOG, lambda: clock[0], background(set()))
    keeper = LedgerKeeper(LOG, lambda: clock[0], usage)
    pods = Pods(charge("ns/jupyter-ann"))
    ledgers = await asyncio.gather(*(keeper.ready(POLICY, pods, 0) for _ in range(20)))
    assert pods.calls == 1
    assert all(ledger is keeper.ledger for ledger in ledgers)
    assert set(keeper.ledger.charges) == {"ns/jupyter-ann"}
    assert keeper.charge("ns/jupyter-ann").user == "ann"


async def test_the_keepers_resync_releases_a_server_gone_and_ends_its_time_at_its_sighting():
    clock = [NOW]
    usage = UsageRecorder(LOG, lambda: clock[0], background(set()))
    keeper = LedgerKeeper(LOG, lambda: clock[0], usage)
    pods = Pods(charge("ns/jupyter-ann"), charge("ns/jupyter-bob", "bob"))
    await keeper.ready(POLICY, pods, 0.05)
    usage.count_usage(POLICY, record("u1", "ns/jupyter-ann", NOW - H))
    released = asyncio.ensure_future(_released(keeper))
    clock[0] = NOW + 60
    pods.charges = [charge("ns/jupyter-bob", "bob")]  # ann's pod went behind the hub's back
    await asyncio.wait_for(released, 10)
    assert set(keeper.ledger.charges) == {"ns/jupyter-bob"}
    # its GPU time ends at the listing before, where it was last seen: an inferred end
    assert usage.usage.records["u1"].ended == NOW
    keeper._resync.cancel()


async def _released(keeper: LedgerKeeper) -> None:
    async with keeper.changed:
        await keeper.changed.wait()


# ---- the waiting line ----------------------------------------------------------------------


def test_the_line_is_first_come_first_served_without_fair_share_and_says_so():
    clock = [NOW]
    line = WaitingLine(lambda: clock[0])
    first = line.waiter(POLICY, "ns/jupyter-ann", "ann", LAB, NOW)
    second = line.waiter(POLICY, "ns/jupyter-bob", "bob", LAB, NOW + 1)
    line.join(POLICY, first, NOW, None)
    line.join(POLICY, second, NOW + 1, None)
    line.line.block(first, "lab")
    where = line.place(POLICY, second, NOW + 2)
    assert (where.position, where.of) == (2, 2)
    assert [w.key for w in where.ahead] == ["ns/jupyter-ann"]
    assert {g: list(keys) for g, keys in line.by_group(POLICY).items()} == {
        "lab": ["ns/jupyter-ann", "ns/jupyter-bob"]
    }
    message = wait_message(POLICY, LAB, second, where, None, NOW + 2)
    assert message.startswith("Waiting for lab: position 2 of 2, 1 spawn ahead of you. ")
    line.line.leave(first)
    assert line.place(POLICY, second, NOW + 3).position == 1
