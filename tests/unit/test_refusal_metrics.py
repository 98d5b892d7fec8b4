"""Why a spawn was refused, as the hub counts it for the refused-spawns alert: every
refusal lands under one of a fixed set of reasons, and the admission's refusals say
which cap refused them.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from prometheus_client import CollectorRegistry

from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.admission import Ledger
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.selection import Request
from jupyterhub_gpu.hub.admission import BUDGETS_UNCHECKED, SpawnAdmission
from jupyterhub_gpu.hub.checks import SpawnRefused
from jupyterhub_gpu.hub.metrics import REASONS, count_refusal, refusal_reason, refusals_counter
from jupyterhub_gpu.hub.server_exit import EXITED_STATUS

POLICY = parse_policy(
    flavors={"h200": {"kind": "gpu"}},
    profiles={"p": {"gpu": {"flavor": "h200"}}},
    groups={
        "dept": {"limit": {"gpus": 3}},
        "lab": {
            "parent": "dept",
            "quota": {"gpus": 2},
            "limit": {"gpus": 3},
            "per_user": {"gpus": 1},
            "profiles": ["p"],
            "budget": {"gpu_hours": 100, "period": "30d"},
        },
        "small": {"limit": {"gpus": 1}, "profiles": ["p"]},
    },
)


def gpus(n: int) -> Request:
    return Request(gpus=Fraction(n), cpu=100, memory=2**20, devices=(("h200", n),))


@pytest.mark.parametrize(
    ("refusal", "reason"),
    [
        (SpawnRefused("profile 'x' is not offered to you", kind="options"), "options"),
        (SpawnRefused("options of the wrong type", 400), "options"),
        (SpawnRefused("the server exited", EXITED_STATUS), "server_exited"),
        (SpawnRefused("waited in the queue", 429), "queue_timeout"),
        (SpawnRefused("the GPU policy is misconfigured", 500), "configuration"),
        (SpawnRefused("the API server could not be reached", 503), "kubernetes"),
        (SpawnRefused("Kubernetes refused the server", kind="kubernetes"), "kubernetes"),
        (SpawnRefused("claim missing", kind="dataset_claim"), "dataset_claim"),
        (SpawnRefused(BUDGETS_UNCHECKED, kind="usage_database"), "usage_database"),
        # a refusal raised without a reason, or with one not in the list: still counted
        (SpawnRefused("something new"), "other"),
        (SpawnRefused("something new", kind="a-new-kind"), "other"),
    ],
)
def test_every_refusal_is_counted_under_a_known_reason(refusal, reason):
    assert refusal_reason(refusal) == reason
    assert reason in REASONS


def test_the_ledger_says_which_cap_refused():
    ledger = Ledger()
    lab, small = POLICY.find_group("lab"), POLICY.find_group("small")
    assert ledger.admit(POLICY, "a", "ann", lab, gpus(1)).admitted
    # ann at her own cap of 1 GPU in lab
    refused = ledger.admit(POLICY, "a2", "ann", lab, gpus(1))
    assert (refused.outcome, refused.kind) == ("refuse", "user_cap")
    # a server bigger than small's whole limit
    refused = ledger.admit(POLICY, "s", "bob", small, gpus(2))
    assert (refused.outcome, refused.kind) == ("refuse", "too_large")
    # dept (lab's parent) full: 3 of 3
    assert ledger.admit(POLICY, "b", "bob", lab, gpus(1)).admitted
    assert ledger.admit(POLICY, "c", "cat", lab, gpus(1)).admitted
    refused = ledger.admit(POLICY, "d", "dan", lab, gpus(1))
    assert (refused.outcome, refused.kind, refused.level) == ("refuse", "group_full", "lab")


async def test_a_budgeted_spawn_refused_while_the_usage_database_is_unread_says_so(tmp_path):
    admission = SpawnAdmission(loaded=True)
    # a database the hub has not read (yet): no budget can be checked
    admission.use_store(UsageStore(f"sqlite:///{tmp_path}/usage.sqlite"), fail_open=False)
    decision = await admission.admit(
        POLICY,
        "ns/jupyter-ann",
        "ann",
        POLICY.find_group("lab"),
        gpus(1),
        show_wait=lambda message: None,
        poll_interval=1,
    )
    assert (decision.outcome, decision.kind) == ("refuse", "usage_database")
    assert decision.reason == BUDGETS_UNCHECKED


def test_refusals_are_counted_per_group_and_reason():
    registry = CollectorRegistry()
    counter = refusals_counter(registry)
    for _ in range(3):
        count_refusal("lab", SpawnRefused("lab has 3 of 3", kind="group_full"), counter)
    count_refusal("", SpawnRefused("bad options", 400), counter)
    metric = "jupyterhub_gpu_spawns_refused_total"
    sample = registry.get_sample_value
    assert sample(metric, {"group": "lab", "reason": "group_full"}) == 3
    assert sample(metric, {"group": "", "reason": "options"}) == 1
    assert sample(metric, {"group": "lab", "reason": "options"}) is None


async def test_a_spawn_refused_by_a_used_up_budget_says_so(tmp_path):
    from jupyterhub_gpu.core.budgets import UsageRecord

    now = 1_800_000_000.0
    store = UsageStore(f"sqlite:///{tmp_path}/usage.sqlite")
    # a server of lab's that has run for 200 hours: lab's 100 GPU-hours are used up
    started = now - 200 * 3600
    record = UsageRecord("old", "ns/jupyter-old", "bob", "lab", "p", "h200", 1.0, started, now)
    store.open([record], now=now)
    admission = SpawnAdmission(loaded=True)
    admission.use_store(store, fail_open=False)
    admission.clock = lambda: now
    await admission.read_usage(POLICY)
    decision = await admission.admit(
        POLICY,
        "ns/jupyter-ann",
        "ann",
        POLICY.find_group("lab"),
        gpus(1),
        show_wait=lambda message: None,
        poll_interval=1,
    )
    assert (decision.outcome, decision.kind) == ("refuse", "budget")
    assert decision.reason != BUDGETS_UNCHECKED
