"""Every message a user reads, with sample values: ``docs/messages.md``, generated.

Each message is made by the function the hub, the spawner or the service makes it
with, on sample policies and usage, so the page shows exactly what users read.
``tests/test_message_catalogue.py`` checks that the page is what this makes.
After a change to a message, write the page again (from the checkout's root)::

    python3 tests/message_catalogue.py
"""

from __future__ import annotations

import dataclasses
import html
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":  # the checkout's packages, whatever is installed
    sys.path[:0] = [str(ROOT), str(ROOT / "jupyterhub-gpu-dev")]

from lab_helpers import run as run_lab  # noqa: E402

from jupyterhub_gpu.core import words  # noqa: E402
from jupyterhub_gpu.core.admission import Charge, Ledger  # noqa: E402
from jupyterhub_gpu.core.budgets import (  # noqa: E402
    BudgetState,
    Told,
    grace_refusal,
    used_line,
    used_up_refusal,
)
from jupyterhub_gpu.core.capacity import FlavorCapacity, flavor_capacity  # noqa: E402
from jupyterhub_gpu.core.dra import DraInventory, pod_allocation  # noqa: E402
from jupyterhub_gpu.core.energy import EnergyCoverage  # noqa: E402
from jupyterhub_gpu.core.exits import ContainerExit, exit_message  # noqa: E402
from jupyterhub_gpu.core.fairshare import Standing, Waiter, place, standing_line  # noqa: E402
from jupyterhub_gpu.core.model import Budget, Idle, PolicyError, parse_policy  # noqa: E402
from jupyterhub_gpu.core.pending import (  # noqa: E402
    explain_unschedulable,
    kueue_queue_line,
    volcano_queue_line,
)
from jupyterhub_gpu.core.profiles import profile_entry  # noqa: E402
from jupyterhub_gpu.core.schedulers import scheduler_for  # noqa: E402
from jupyterhub_gpu.core.selection import Refused, Request, offers, select  # noqa: E402
from jupyterhub_gpu.core.utilisation import Coverage  # noqa: E402
from jupyterhub_gpu.hub.admission import BUDGETS_UNCHECKED, wait_message  # noqa: E402
from jupyterhub_gpu.hub.checks import (  # noqa: E402
    SpawnRefused,
    checked_policy,
    kubernetes_refused,
    missing_claim,
    refuse_a_site_profile_list,
    unreachable,
)
from jupyterhub_gpu.hub.queue_watch import queue_timeout_refusal  # noqa: E402
from jupyterhub_gpu.service import page  # noqa: E402
from jupyterhub_gpu.service.budget_rules import budget_notice_text, budget_stop_text  # noqa: E402
from jupyterhub_gpu.service.hours import HoursView  # noqa: E402
from jupyterhub_gpu.service.idle import (  # noqa: E402
    Candidate,
    Utilization,
    idle_cancelled_text,
    idle_notice_text,
    idle_stop_text,
    judge,
)
from jupyterhub_gpu.service.orphans import orphan_deleted_text, orphan_found_text  # noqa: E402
from jupyterhub_gpu.service.rules import over_limit  # noqa: E402
from jupyterhub_gpu.service.runtime_rules import (  # noqa: E402
    max_runtime_stop_text,
    over_limit_stop_text,
    over_limit_text,
)
from jupyterhub_gpu.service.server_events import (  # noqa: E402
    DISRUPTIONS,
    UNSCHEDULED_TEXT,
    WHAT_TO_DO_ALSO,
)
from jupyterhub_gpu.service.server_status import (  # noqa: E402
    AVOID,
    STOP_WHY,
    WHAT_TO_DO,
    budget_lines,
    policy_change,
    stop_text,
)
from jupyterhub_gpu.service.state import ServerPod  # noqa: E402
from jupyterhub_gpu.service.views import DATABASE_UNAVAILABLE, Server, capacity_view  # noqa: E402
from jupyterhub_gpu_dev.localcluster.dra import (  # noqa: E402
    device_classes,
    render_resource_slices,
)
from jupyterhub_gpu_dev.localcluster.nodepools import render_nodes  # noqa: E402

PAGE = ROOT / "docs" / "messages.md"
COMMAND = "python3 tests/message_catalogue.py"
#: the samples' "now": 2026-12-01 13:50 UTC
NOW = datetime(2026, 12, 1, 13, 50, tzinfo=UTC).timestamp()
GiB = 2**30

POLICY = parse_policy(
    flavors={"a100": {"kind": "gpu", "display_name": "A100"}},
    profiles={
        "gpu": {
            "display_name": "One A100",
            "cpu": 8,
            "memory": "64Gi",
            "gpu": {"flavor": "a100"},
            "options": {"gpus": {"choices": [1, 2, 4]}},
        },
        "cpu": {"display_name": "CPU only", "cpu": 2, "memory": "8Gi"},
    },
    groups={
        "students": {
            "display_name": "Students",
            "profiles": ["gpu", "cpu"],
            "quota": {"gpus": 4},
            "per_user": {"servers": 1},
            "max_runtime": "8h",
            "budget": {"gpu_hours": 20, "period": "7d"},
        },
        "research": {
            "display_name": "Research",
            "profiles": ["gpu", "cpu"],
            "quota": {"gpus": 12, "memory": "131Gi"},
            "limit": {"gpus": 24, "memory": "131Gi"},
            "per_user": {
                "gpus": 2,
                "servers": 3,
                "budget": {"gpu_hours": 0.025, "period": "1d"},
            },
            "budget": {
                "gpu_hours": 2000,
                "period": "30d",
                "when_exhausted": "stop",
                "grace": "15m",
            },
        },
    },
)
FAIR = parse_policy(
    flavors={"a100": {"kind": "gpu", "display_name": "A100"}},
    profiles={"gpu": {"gpu": {"flavor": "a100"}}},
    when_full="wait",
    fair_share={"half_life": "7d", "max_wait": "2h"},
    groups={"lab": {"display_name": "Vision Lab", "quota": {"gpus": 1}, "profiles": ["gpu"]}},
)
#: fair share counting billed units (``fair_share.count: billed_units``)
FAIR_UNITS = parse_policy(
    flavors={"a100": {"kind": "gpu", "display_name": "A100", "billing": {"weight": 2}}},
    profiles={"gpu": {"gpu": {"flavor": "a100"}}},
    when_full="wait",
    fair_share={"half_life": "7d", "max_wait": "2h", "count": "billed_units"},
    groups={"lab": {"display_name": "Vision Lab", "quota": {"gpus": 1}, "profiles": ["gpu"]}},
)
VOLCANO = parse_policy(
    scheduler={"name": "volcano"},
    flavors={"a100": {"kind": "gpu"}},
    profiles={"gpu": {"gpu": {"flavor": "a100"}}},
    groups={"lab": {"quota": {"gpus": 1}, "profiles": ["gpu"]}},
)

#: a node of four H200s run by NVIDIA's DRA driver (GPU 0 as two 3g.71gb MIG
#: partitions), whose DeviceClass also serves nvidia.com/gpu (the extended-resource bridge)
DRA_POOLS = {
    "dra": {"extended_resource_name": "nvidia.com/gpu"},
    "node_pools": {
        "h200": {
            "count": 1,
            "cpu": 64,
            "memory": "512Gi",
            "dra": True,
            "gpu": {
                "product": "NVIDIA-H200-NVL",
                "memory": 143771,
                "count": 4,
                "mig": {"strategy": "mixed", "devices": {"3g.71gb": 2}},
            },
        },
    },
}
DRA = parse_policy(
    flavors={
        "h200": {
            "kind": "dra",
            "display_name": "H200 (DRA)",
            "selectors": ["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200 NVL'"],
        },
        "mig": {
            "kind": "dra",
            "display_name": "H200 3g.71gb (DRA)",
            "device_class": "mig.nvidia.com",
        },
        "bridged": {
            "kind": "gpu",
            "display_name": "H200 (bridge)",
            "device_class": "gpu.nvidia.com",
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"},
        },
    },
    profiles={"gpu": {"gpu": {"flavor": "h200"}}},
    groups={"lab": {"quota": {"gpus": 1}, "profiles": ["gpu"]}},
)


#: a budget of 500 billed units a month (each hour at its flavor's weight)
IN_UNITS = Budget(
    gpu_hours=None, units=Fraction(500), period=30 * 86400, when_exhausted="stop", grace=900
)


def _dra_claim(pod_uid: str, *devices: str) -> dict[str, Any]:
    """A claim of the pod ``pod_uid``, allocated ``devices`` of the H200 node."""
    results = [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h200-0", "device": d}
        for d in devices
    ]
    return {
        "metadata": {
            "name": f"claim-{pod_uid}",
            "namespace": "lab",
            "ownerReferences": [{"kind": "Pod", "uid": pod_uid, "controller": True}],
        },
        "status": {"allocation": {"devices": {"results": results}}},
    }


def _dra_cluster() -> tuple[list[dict[str, Any]], DraInventory]:
    """The H200 node, and its DRA objects with two servers' claims allocated."""
    inventory = DraInventory(
        render_resource_slices(DRA_POOLS),
        device_classes(DRA_POOLS),
        [_dra_claim("u1", "gpu-1"), _dra_claim("u2", "gpu-0-mig-3g71gb-1")],
    )
    return render_nodes(DRA_POOLS), inventory


#: a section: its title, what it is, and (situation, message) pairs
Section = tuple[str, str, list[tuple[str, str]]]


def _gpu_request(gpus: int = 1) -> Request:
    profile = POLICY.profiles["gpu"]
    return Request(
        gpus=Fraction(gpus), cpu=profile.cpu, memory=profile.memory, devices=(("a100", gpus),)
    )


def _charge(ledger: Ledger, user: str, group: str, n: int, gpus: int = 1) -> None:
    key = f"jhub/jupyter-{user}-{n}"
    ledger.record(POLICY, Charge(key, user, group, _gpu_request(gpus), "in-quota"))


def _refused(call: Callable[[], Any]) -> str:
    try:
        call()
    except (Refused, SpawnRefused) as e:
        return str(e)
    raise AssertionError(f"{call} was not refused")


def formats() -> Section:
    rows = [
        ("GPU-hours alone", words.gpu_hours(2000)),
        ("GPU-hours alone", words.gpu_hours(20.5)),
        ("GPU-hours alone", words.gpu_hours(0.0125)),
        ("GPU-hours alone", words.gpu_hours(1)),
        ("two numbers said together", "{} of {}".format(*words.numbers([0.025, 0.025]))),
        ("two numbers said together", "{} of {}".format(*words.numbers([20.5, 20]))),
        ("two numbers said together", "{} of {}".format(*words.numbers([1999.96, 2000]))),
        ("a table's number", words.number(12345.6, grouped=True)),
        ("a count", words.count(1, "spawn")),
        ("a count", words.count(3, "spawn")),
        ("GPUs", words.gpus(Fraction(1, 2))),
        ("a duration", words.duration(45)),
        ("a duration", words.duration(5400)),
        ("a duration", words.duration(8 * 3600 + 5)),
        ("a duration", words.duration(2 * 86400 + 4 * 3600)),
        ("a moment, where the reader's time zone is not known", words.moment(NOW + 900)),
    ]
    return (
        "Numbers, units, durations and times",
        "One rule each (`jupyterhub_gpu/core/words.py`; the JupyterLab extension's "
        "`jupyterlab-gpu/src/words.ts` keeps the same rules, tested on the same values). "
        "Pages in the browser (JupyterLab, the dashboard) say moments in the reader's "
        "time zone, in the same format (`2026-12-01 15:05 CET`); every other text says "
        "UTC.",
        rows,
    )


def spawn_refusals() -> Section:
    students, research = POLICY.group("students"), POLICY.group("research")
    one = _gpu_request()
    rows = []
    ledger = Ledger()
    _charge(ledger, "stud0", "students", 0)
    rows.append(
        (
            "a member's own server cap (one server)",
            ledger.decide(POLICY, "stud0", students, one).reason,
        )
    )
    ledger = Ledger()
    for n in range(3):
        ledger.record(
            POLICY,
            Charge(f"jhub/r{n}", "ria", "research", Request(cpu=1000, memory=GiB), "in-quota"),
        )
    rows.append(
        (
            "a member's own server cap (several)",
            ledger.decide(POLICY, "ria", research, Request(cpu=1000, memory=GiB)).reason,
        )
    )
    ledger = Ledger()
    _charge(ledger, "rob", "research", 0, 2)
    rows.append(("a member's own GPU cap", ledger.decide(POLICY, "rob", research, one).reason))
    rows.append(
        (
            "a server larger than the group may ever hold",
            Ledger().decide(POLICY, "stud1", students, _gpu_request(8)).reason,
        )
    )
    ledger = Ledger()
    for n in range(4):
        _charge(ledger, f"stud{n}", "students", n)
    rows.append(("the group's limit reached", ledger.decide(POLICY, "stud9", students, one).reason))
    ledger = Ledger()
    for n in range(2):
        _charge(ledger, f"res{n}", "research", n, 2)
    rows.append(
        ("the group's memory limit reached", ledger.decide(POLICY, "res9", research, one).reason)
    )
    budget = research.budget
    assert budget is not None
    rows += [
        (
            "a used-up budget",
            used_up_refusal("Research", 2000.0, budget, (NOW + 86400 + 600, 12.5)),
        ),
        (
            "a used-up budget, when room returns not known",
            used_up_refusal("Research", 2000.0, budget, None),
        ),
        (
            "a member's used-up budget of 0.025 GPU-hours",
            used_up_refusal("ria in Research", 0.025, research.user_budget, (NOW + 3600, 0.0125)),
        ),
        (
            "a `stop` budget too low for every server's grace",
            grace_refusal("Research", budget, 0.5, 2.0, 1.0),
        ),
        (
            "a used-up budget in billed units",
            used_up_refusal("Research", 500.0, IN_UNITS, (NOW + 86400 + 600, 37.5)),
        ),
        (
            "a `stop` budget in billed units too low for every server's grace",
            grace_refusal("Research", IN_UNITS, 1.25, 2.0, 1.0, 1.875),
        ),
        ("the usage database unavailable", BUDGETS_UNCHECKED),
    ]
    rows += [
        (
            "a user in no group",
            _refused(lambda: select(POLICY, [], {})),
        ),
        (
            "a profile the user is not offered (e.g. from an old bookmark)",
            _refused(lambda: select(POLICY, ["students"], {"profile": "research--gpu"})),
        ),
        (
            "more GPUs than the group allows",
            _refused(
                lambda: select(POLICY, ["research"], {"profile": "research--gpu", "gpus": "4"})
            ),
        ),
        (
            "a choice the form does not have",
            _refused(
                lambda: select(POLICY, ["students"], {"profile": "students--gpu", "gpus": "3"})
            ),
        ),
        (
            "an option the form does not have",
            _refused(lambda: select(POLICY, ["students"], {"profile": "students--gpu", "x": 1})),
        ),
        (
            "a server whose process exits at start",
            exit_message(ContainerExit(1, "Error", None), ["ModuleNotFoundError: No module"]),
        ),
        (
            "a server killed for its memory at start",
            exit_message(ContainerExit(137, "OOMKilled", None), []),
        ),
        (
            "a server whose process ends at once",
            exit_message(ContainerExit(0, "Completed", None), []),
        ),
        (
            "a server held in its scheduler's queue too long",
            queue_timeout_refusal(1260, "Kueue", "lab", 1200),
        ),
        ("the Kubernetes API server unreachable", str(unreachable(OSError("refused")))),
        (
            "the Kubernetes API server refuses the pod",
            str(
                kubernetes_refused(
                    'pods "jupyter-ann" is forbidden: exceeded quota: gpu-quota, requested: '
                    "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=4, limited: "
                    "requests.nvidia.com/gpu=4"
                )
            ),
        ),
        (
            "a dataset's claim missing",
            str(missing_claim("ImageNet", "imagenet", "research")),
        ),
    ]
    spawner = _FakeSpawner(PolicyError("bad"))
    rows.append(("the GPU policy broken", _refused(lambda: checked_policy(spawner))))
    spawner = _FakeSpawner(POLICY)
    rows.append(("no GPU policy configured", _refused(lambda: checked_policy(spawner))))
    rows.append(
        (
            "a profile_list of the site's own",
            _refused(lambda: refuse_a_site_profile_list(spawner, [{"display_name": "x"}])),
        )
    )
    return (
        "Spawn refusals",
        "What the spawn page and the REST API say when a server cannot start (the spawn "
        "page puts `Spawn failed: ` before it). Each says what holds it back and what "
        "to do next.",
        rows,
    )


class _FakeSpawner:
    """What ``spawn_checks``' checks read of a spawner: its policy, config and log."""

    def __init__(self, policy: Any) -> None:
        self._policy = policy
        self.config: dict[str, Any] = {}
        self.log = SimpleNamespace(error=lambda *a, **k: None)

    @property
    def gpu_policy(self) -> Any:
        if isinstance(self._policy, Exception):
            raise self._policy
        return self._policy


def waiting() -> Section:
    lab = FAIR.group("lab")
    reason = Ledger().decide(FAIR, "x", lab, _gpu_request(2)).reason
    full = Ledger()
    full.record(FAIR, Charge("jhub/a", "ann", "lab", _gpu_request(), "in-quota"))
    held = full.decide(FAIR, "bob", lab, _gpu_request()).reason
    assert reason
    assert held
    plain = parse_policy(
        flavors={"a100": {"kind": "gpu"}},
        profiles={"gpu": {"gpu": {"flavor": "a100"}}},
        when_full="wait",
        groups={"lab": {"display_name": "Vision Lab", "quota": {"gpus": 1}, "profiles": ["gpu"]}},
    )
    chain = ("lab",)
    me = Waiter("jhub/me", "me", "lab", chain, NOW, 5, "lab", (0.5, 0.5))
    first = Waiter("jhub/a", "amy", "lab", chain, NOW - 60, 1, "lab", (0.5, 0.2))
    second = Waiter("jhub/b", "ben", "lab", chain, NOW - 30, 2, "lab", (0.5, 0.5))
    old = Waiter("jhub/c", "cal", "lab", chain, NOW - 3 * 3600, 3, "lab", (0.5, 0.9))
    heavy = Waiter("jhub/d", "dan", "lab", chain, NOW - 10, 6, "lab", (0.9, 0.9))
    rows = [
        (
            "first in its group's line",
            wait_message(plain, lab, me, place(me, [me]), held, NOW),
        ),
        (
            "behind others",
            wait_message(plain, lab, me, place(me, [first, second, me]), None, NOW),
        ),
        (
            "behind one",
            wait_message(plain, lab, me, place(me, [first, me]), None, NOW),
        ),
        (
            "with fair share, first",
            wait_message(FAIR, lab, me, place(me, [me, heavy]), held, NOW),
        ),
        (
            "with fair share, behind others",
            wait_message(FAIR, lab, me, place(me, [old, first, second, me]), None, NOW),
        ),
        (
            "with fair share counting billed units, first",
            wait_message(FAIR_UNITS, lab, me, place(me, [me, heavy]), held, NOW),
        ),
        (
            "with fair share counting billed units, behind others",
            wait_message(FAIR_UNITS, lab, me, place(me, [old, first, second, me]), None, NOW),
        ),
        (
            "the cluster has no free GPU",
            explain_unschedulable(
                "0/9 nodes are available: 3 Insufficient nvidia.com/gpu, 6 node(s) didn't "
                "match Pod's node affinity/selector.",
                POLICY.flavors["a100"],
                ("nvidia.com/gpu",),
            )
            or "",
        ),
        (
            "no node has the flavor",
            explain_unschedulable(
                "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
                POLICY.flavors["a100"],
                ("nvidia.com/gpu",),
            )
            or "",
        ),
        (
            "held by Kueue",
            kueue_queue_line(
                "lab",
                {
                    "spec": {"queueName": "lab"},
                    "status": {
                        "conditions": [
                            {
                                "type": "QuotaReserved",
                                "status": "False",
                                "message": "couldn't assign flavors to pod set main: "
                                "insufficient unused quota for nvidia.com/gpu in flavor "
                                "jupyterhub-gpu, 1 more needed",
                            }
                        ]
                    },
                },
                2,
            ),
        ),
        (
            "held by Volcano",
            volcano_queue_line(
                "lab",
                {
                    "status": {
                        "conditions": [
                            {"type": "Unschedulable", "status": "True", "reason": "NotEnough"}
                        ]
                    }
                },
                1,
            ),
        ),
        (
            "in a queue the hub cannot read",
            scheduler_for(VOLCANO).unread_line("lab"),
        ),
    ]
    return (
        "Waiting",
        "What the spawn page shows while a server waits: for its group's room, for the "
        "cluster, in a scheduler's queue.",
        rows,
    )


def spawn_form() -> Section:
    students, research = POLICY.group("students"), POLICY.group("research")
    by_slug = {o.slug: o for o in offers(POLICY, ["students", "research"])}
    capacity = {
        "a100": FlavorCapacity("a100", "nvidia.com/gpu", "GPUs", Fraction(1), 16, 13, 4),
    }
    week = students.budget
    month = research.budget
    assert week is not None
    assert month is not None
    assert research.user_budget is not None
    ledger = Ledger()
    _charge(ledger, "stud1", "students", 1)
    states = [BudgetState("Students", week, 12.4, group="students")]
    rows = [
        (
            "a GPU profile",
            profile_entry(POLICY, ledger, by_slug["students--gpu"], capacity, states, user="me")[
                "description"
            ],
        )
    ]
    mine = Ledger()
    _charge(mine, "me", "students", 0)
    rows.append(
        (
            "a GPU profile while the user runs their one server",
            profile_entry(POLICY, mine, by_slug["students--gpu"], capacity, states, user="me")[
                "description"
            ],
        )
    )
    busy = Ledger()
    _charge(busy, "res1", "research", 1)
    used = [
        BudgetState("Research", month, 1999.96, group="research"),
        BudgetState("me in Research", research.user_budget, 0.0125, group="research", user="me"),
    ]
    rows.append(
        (
            "memory binds before the GPUs do",
            profile_entry(POLICY, busy, by_slug["research--gpu"], None, used, user="me")[
                "description"
            ],
        )
    )
    gone = [BudgetState("Students", week, 20.0, group="students")]
    entry = profile_entry(POLICY, Ledger(), by_slug["students--gpu"], None, gone, NOW + 7200)
    rows.append(("a GPU profile whose budget is used up (title)", entry["display_name"]))
    rows.append(("a GPU profile whose budget is used up", entry["description"]))
    rows.append(
        (
            "a CPU profile",
            profile_entry(POLICY, ledger, by_slug["students--cpu"], capacity, states)[
                "description"
            ],
        )
    )
    nodes, inventory = _dra_cluster()
    (dra_offer,) = offers(DRA, ["lab"])
    dra_capacity = flavor_capacity(DRA, nodes, [], dra=inventory)
    rows.append(
        (
            "a profile of DRA devices",
            profile_entry(DRA, Ledger(), dra_offer, dra_capacity, [])["description"],
        )
    )
    rows.append(
        (
            "with fair share: the user's standing",
            standing_line(
                "Vision Lab", Standing(40.0, 0.5, 0.6), Standing(3.2, 0.25, 0.125), 7 * 86400
            ),
        )
    )
    rows.append(
        (
            "with fair share counting billed units: the user's standing",
            standing_line(
                "Vision Lab",
                Standing(80.0, 0.5, 0.6),
                Standing(6.4, 0.25, 0.125),
                7 * 86400,
                "billed_units",
            ),
        )
    )
    return (
        "The spawn form",
        "Each profile's description on the spawn form (and in `jupyterhub-gpu profiles`): "
        "what it holds, what the group has left, its budgets, and the cluster's free GPUs.",
        rows,
    )


def _server(user: str, group: str) -> Server:
    started = datetime.fromtimestamp(NOW - 3 * 3600, UTC)
    return Server(user, "", group, "gpu", started, True, None, last_activity=started)


def _pod(user: str, group: str, flavor: str = "a100") -> ServerPod:
    charge = Charge(f"jhub/jupyter-{user}", user, group, _gpu_request(), "in-quota")
    return ServerPod(
        f"jhub/jupyter-{user}", charge, user, "", None, profile="gpu", uid=f"uid-{user}"
    )


def notices() -> Section:
    research = POLICY.group("research")
    now = datetime.fromtimestamp(NOW, UTC)
    rule = Idle(after=7200, gpu_utilization_below=5)
    dcgm = judge(
        Candidate(
            _server("ann", "students"), _pod("ann", "students"), rule, "DCGM_FI_DEV_GPU_UTIL"
        ),
        now,
        {("jhub", "jupyter-ann"): Utilization(1.5, True)},
        prometheus=True,
    ).signal
    activity = judge(
        Candidate(
            _server("ann", "students"), _pod("ann", "students"), rule, "DCGM_FI_DEV_GPU_UTIL"
        ),
        now,
        None,
        prometheus=False,
    ).signal
    shared = judge(
        Candidate(_server("ann", "students"), _pod("ann", "students"), rule, None),
        now,
        None,
        prometheus=True,
    ).signal
    over = Ledger()
    for n in range(6):
        _charge(over, f"stud{n}", "students", n)
    budget = research.budget
    assert budget is not None
    assert research.user_budget is not None
    used = used_line("Research", 2000.4, budget)
    own = used_line("ria in Research", 0.025, research.user_budget)
    stop = Told(("research", ""), NOW, NOW + 900)
    warn = Told(("research", "ria"), NOW, None)
    rows = [
        (
            "a server past its group's maximum runtime",
            max_runtime_stop_text("ann", "Students", 8 * 3600),
        ),
        ("a group over its limit", over_limit_text(over_limit(POLICY, over)["students"])),
        (
            "a server stopped as its group stayed over its limit",
            over_limit_stop_text("ann/train", "Students", Fraction(2), 600),
        ),
        ("idle by its GPU's use", idle_notice_text("ann", "Students", dcgm, NOW + 600, 600)),
        (
            "idle by notebook activity",
            idle_notice_text("ann", "Students", activity, NOW + 600, 600),
        ),
        ("idle on a shared GPU", idle_notice_text("ann", "Students", shared, NOW + 600, 600)),
        ("in use again", idle_cancelled_text("ann", "Students")),
        ("stopped for idling", idle_stop_text("ann", "Students", dcgm, 600)),
        ("a `stop` budget used up", budget_notice_text("ria", used, stop)),
        ("a `warn` budget used up", budget_notice_text("ria", own, warn)),
        (
            "a `warn` budget used up while a `stop` budget stops the server",
            budget_notice_text("ria", own, warn, (NOW + 900, "Research")),
        ),
        ("stopped for a used-up budget", budget_stop_text("ria", used, stop)),
        (
            "a server pod the hub does not have",
            orphan_found_text("jhub/jupyter-ann", "ann", "", "students", NOW + 600),
        ),
        (
            "a server pod the hub does not have, only reported",
            orphan_found_text("jhub/jupyter-ann", "ann", "", "students", None),
        ),
        ("such a pod deleted", orphan_deleted_text("jhub/jupyter-ann", "ann", "", 600)),
    ]
    return (
        "Notices",
        "What the GPU service tells users (on the dashboard, in JupyterLab, in its log) "
        "when it finds something or acts on a server.",
        rows,
    )


def after_a_stop() -> Section:
    rows = [
        (
            f"scheduled stop: {kind}",
            STOP_WHY[kind].format(**values) + "; to avoid it: " + AVOID[kind],
        )
        for kind, values in (
            ("budget", {"owner": "Research"}),
            ("idle", {"signal": "GPU utilisation below 5% for 2 hours"}),
            ("max_runtime", {"group": "Students", "runtime": words.duration(8 * 3600)}),
        )
    ]
    for reason, what in WHAT_TO_DO.items():
        rows.append((f"stopped by the service: {reason}", f"{stop_text(reason)}. {what}"))
    for (kind, reason), (code, text) in DISRUPTIONS.items():
        rows.append(
            (
                f"stopped by the cluster: {kind} {reason or ''}".rstrip(),
                f"This server stopped: {text}. {WHAT_TO_DO_ALSO[code]}",
            )
        )
    for code, text in UNSCHEDULED_TEXT.items():
        rows.append((f"stopped otherwise: {code}", f"{text}. {WHAT_TO_DO_ALSO[code]}"))
    pod = dataclasses.replace(_pod("ann", "students"), profile="retired")
    rows.append(("the policy changed while it ran", policy_change(POLICY, pod) or ""))
    hub = _last_stop_html(
        [
            {
                "server": "",
                "label": "Your server",
                "reason": "idle",
                "text": stop_text("idle"),
                "at": words.moment(NOW),
                "epoch": NOW,
            }
        ]
    )
    rows.append(("the hub's home and spawn pages", hub))
    return (
        "Stops",
        "What a server's JupyterLab is told of the stops ahead and, after a stop, why "
        "it stopped and what to do (the hub's pages say the same).",
        rows,
    )


def _last_stop_html(stops: list[dict[str, Any]]) -> str:
    import jinja2

    from jupyterhub_gpu.hub.pages import TEMPLATES

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True)
    return _text(env.get_template("gpu_last_stops.html").render(stops=stops))


def _text(rendered: str) -> str:
    """A rendered part of a page as its reader reads it."""
    text = re.sub(r"<[^>]+>", " ", rendered.replace("{#", "").replace("#}", ""))
    text = html.unescape(text)
    return re.sub(r"\s+", " ", text).strip().replace(" .", ".")


def dashboard() -> Section:
    accounting = {
        "ok": False,
        "error": DATABASE_UNAVAILABLE,
        "when_unavailable": "refuse",
        "behind": True,
        "unwritten": 3,
        "oldest_unwritten_age_seconds": 420,
        "last_write": NOW - 420,
        "numbers_from": NOW - 400,
        "dropped": 1,
    }
    view = {
        "gpu_hours": {"accounting": accounting, "groups": {}},
        "charts": [],
        "range": "day",
    }
    hours = {"used": 1999.96, "budget": 2000.0, "period_seconds": 30 * 86400, "exhausted": False}
    chart_view = {
        "gpu_hours": {
            "accounting": {"ok": True},
            "groups": {"research": hours},
        },
        "charts": [
            {"group": "research", "title": "Research", "times": [], "flavors": {}, "step": 60}
        ],
        "range": "day",
    }
    chart = re.search(
        r'<div class="muted">([^<]*)</div></div></div>', page.gpu_time_section(chart_view)
    )
    capacity = {
        "known": True,
        "flavors": [
            {
                "display_name": "A100",
                "allocated": 13,
                "allocatable": 16,
                "unit": "GPUs",
                "free": 3,
                "nodes": 1,
                "note": "",
            }
        ],
    }
    return (
        "The dashboard",
        "The GPU service's page (`/services/gpu/`), where its numbers and the notices "
        "above are shown.",
        [
            (
                "GPU-hour accounting failing",
                _text(page.gpu_time_section(view).split("<div class")[0]),
            ),
            ("a group's GPU-hours, under its chart", chart.group(1) if chart else ""),
            ("cluster capacity", _text(page.capacity_section(capacity))),
            ("cluster capacity unknown", _text(page.capacity_section({"known": False}))),
            ("what showback's kWh do not cover, under its table", _energy_note()),
            *_dra_dashboard(),
            ("the service's replicas (admins only)", _text(page.lease_section(LEASE, 1))),
        ],
    )


def _energy_note() -> str:
    """Showback's energy coverage: a month with shared GPUs, a server without power
    series and two days Prometheus holds nothing for."""
    readings = Coverage(NOW - 30 * 86400, NOW, 28 * 86400, ((NOW - 30 * 86400, NOW - 28 * 86400),))
    return EnergyCoverage(1520.0, 1180.5, 312.0, 27.5, readings).note() or ""


#: the replicas' Lease as the dashboard gets it (``LeaseElector.to_json``)
LEASE = {
    "lease": "jhub/jupyterhub-gpu-service",
    "identity": "jupyterhub-gpu-service-7d9f-b",
    "acting": False,
    "holder": "jupyterhub-gpu-service-7d9f-a",
    "acquired": NOW - 3600,
    "renewed": NOW - 2,
    "transitions": 3,
    "duration_seconds": 15.0,
    "renew_deadline_seconds": 10.0,
    "retry_period_seconds": 2.0,
    "error": None,
}


def _dra_dashboard() -> list[tuple[str, str]]:
    """What the dashboard says of DRA devices: each flavor's capacity, what a server
    holds, and what it says when the DRA objects cannot be read."""
    nodes, inventory = _dra_cluster()

    def capacity(flavor: str, found: DraInventory) -> str:
        counted = flavor_capacity(DRA, nodes, [], dra=found)
        view = capacity_view({flavor: counted[flavor]}, DRA)
        return _text(page.capacity_section(view))

    unmapped = device_classes({"node_pools": DRA_POOLS["node_pools"]})
    devices = pod_allocation(inventory, "u1").words + pod_allocation(inventory, "u2").words
    return [
        ("cluster capacity: a DRA flavor", capacity("h200", inventory)),
        ("cluster capacity: MIG partitions through DRA", capacity("mig", inventory)),
        (
            "cluster capacity: a flavor DRA serves through the bridge",
            capacity("bridged", inventory),
        ),
        (
            "cluster capacity: a bridged flavor no DeviceClass maps",
            capacity(
                "bridged",
                DraInventory(render_resource_slices(DRA_POOLS), unmapped, inventory.claims),
            ),
        ),
        (
            "cluster capacity: the DRA objects unreadable",
            capacity("h200", DraInventory(problem="403 Forbidden")),
        ),
        ("the DRA devices of servers, under their profiles", "; ".join(devices)),
    ]


def jupyterlab() -> Section:
    research = POLICY.group("research")
    budgets = budget_lines(
        POLICY,
        research,
        "ria",
        {"research": HoursView(2000.4, 2000.0, 30 * 86400, exhausted=True)},
        {("ria", "research"): HoursView(0.025, 0.025, 86400, exhausted=True)},
    )
    idle = {
        "kind": "idle",
        "at": NOW + 600,
        "why": STOP_WHY["idle"].format(signal="GPU utilisation below 5% for 2 hours"),
        "avoid": AVOID["idle"],
    }
    budget = {
        "kind": "budget",
        "at": NOW + 900,
        "why": STOP_WHY["budget"].format(owner="Research"),
        "avoid": AVOID["budget"],
    }
    runtime = {
        "kind": "max_runtime",
        "at": NOW + 840,
        "why": STOP_WHY["max_runtime"].format(group="Research", runtime=words.duration(8 * 3600)),
        "avoid": AVOID["max_runtime"],
    }
    answer = {
        "group": {"name": "research", "display_name": "Research"},
        "flavor": {"name": "a100", "display_name": "A100", "units": 1},
        "gpus_text": "1",
        "budgets": budgets,
        "quota": {
            "group": "Research",
            "gpus_used_text": "13",
            "quota_gpus": 12.0,
            "limit_gpus": 24.0,
            "servers": 9,
        },
        "stops": [idle, runtime, budget],
    }
    notice = budget_notice_text(
        "ria",
        used_line("Research", 2000.4, research.budget),
        Told(("research", ""), NOW, NOW + 900),
    )
    said = run_lab(
        """
        const a = data.answer, now = data.now, [group, own] = a.budgets;
        const low = {...group, used_gpu_hours: 1999.96, left_gpu_hours: 0.04, exhausted: false};
        const [idle, runtime, budget] = a.stops;
        result = [
          ["the status bar", messages.statusLine({service: a}, false, now)],
          ["the status bar, the service not answering",
           messages.statusLine({service: null}, false, now)],
          ["the details, the service not answering",
           messages.unreachableText("no answer within 5 s")],
          ...a.budgets.map(b => ["the details: a budget", messages.budgetRow(b).join(": ")]),
          ["the details: the group", messages.quotaText(a.quota)],
          ...a.stops.map(s => ["the details: a stop ahead", messages.stopItem(s, now)]),
          ["the details: a notice", messages.noticeItem({at: now, text: data.notice})],
          ["a used-up budget that stops the server", messages.budgetUsedUpText(group, budget, now)],
          ["a used-up budget that warns", messages.budgetUsedUpText(own, undefined, now)],
          ["a budget running low", messages.budgetLowText(low)],
          ["an idle stop ahead", messages.idleText(idle, now)],
          ["the maximum runtime ahead", messages.runtimeText(runtime, now)],
          ["documents saved before a stop", messages.savedText(["notes.ipynb", "train.py"], idle)],
          ...a.stops.map(s => ["after a stop it announced",
                               messages.announcedStopWords(s).join(" ")]),
          ["after a stop nobody announced", messages.UNANNOUNCED_WORDS.join(" ")],
          ["after a stop the hub's page explains",
           messages.hubReasonWords("This server was stopped through the hub").join(" ")],
        ];
        """,
        {"answer": answer, "now": NOW, "notice": notice},
    )
    return (
        "JupyterLab",
        "What the JupyterLab extension shows from the GPU service's answer about its "
        "server (its sentences are in `jupyterlab-gpu/src/messages.ts`, run here in "
        "Node.js on a sample answer; a reader in UTC sees these moments).",
        [(situation, text) for situation, text in said],
    )


SECTIONS = (
    formats,
    spawn_refusals,
    waiting,
    spawn_form,
    notices,
    after_a_stop,
    jupyterlab,
    dashboard,
)


def _escaped(text: str) -> str:
    """A message as Markdown text: its characters as they are, on one line."""
    text = text.replace("\n", " ⏎ ")
    return re.sub(r"([\\`*_\[\]<>#|])", r"\\\1", text)


def catalogue() -> str:
    """The page: every section's messages, as generated now."""
    lines = [
        "# Messages users read",
        "",
        "Every message the bundle shows users (spawn refusals, the spawn form, the "
        "waiting line, the GPU service's notices, JupyterLab, the hub's pages and the "
        "dashboard) with sample values, in one place to read them side by side. They "
        "follow one set of rules: the group's display name, no configuration keys, "
        "numbers and units written one way, durations in words, one format for times, "
        "and in every refusal what to do next.",
        "",
        "This page is generated from the functions that make the messages "
        f"(`tests/message_catalogue.py`); a test fails when it differs. After changing a "
        f"message, write it again from the checkout's root with `{COMMAND}`.",
        "",
        "The samples' policy: **Students** (4 GPUs, one server per member, 8 hours per "
        "server, 20 GPU-hours a week) and **Research** (12 GPUs guaranteed, 24 at most, "
        "131Gi of memory, 2000 GPU-hours a month that stop servers when used up, "
        "0.025 GPU-hours a day per member); the samples' time is "
        f"{words.moment(NOW)}.",
    ]
    for make in SECTIONS:
        title, about, rows = make()
        lines += ["", f"## {title}", "", about, ""]
        for situation, message in rows:
            lines.append(f"- *{_escaped(situation)}*: {_escaped(message)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    PAGE.write_text(catalogue())
    print(f"wrote {PAGE.relative_to(ROOT)}")
