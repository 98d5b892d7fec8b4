"""Each shipped example does what its values promise, on the local cluster.

For each example in ``helm-values/``, a cluster of this module's own with the nodes
``jupyterhub-gpu demo`` derives from its flavors (and the scheduler it runs for
them), the objects the policy implies, and a real hub running the example's policy
and ``hub.config`` as the demo runs them, as the hub's service account under the
rendered RBAC. The promises are read from the values, for each group with a GPU
quota:

- **per-user caps**: a member starts the group's largest server, then the smallest
  ones beside it, as named servers, until ``per_user`` refuses, with the numbers;
- **quota and burst**: members start the largest server a member may start until the
  limit: those within the quota are in-quota, the rest over-quota, and the next is
  refused with the numbers (when the limit is the quota, no server bursts);
- **fixed profiles**: every server's pod gets exactly its profile's CPUs and memory
  as requests and limits, on a node that offers its flavor.

Every started server is a real JupyterLab on the local pod runner, so filling a
group costs a server process per server: a group whose limit takes more than
``MAX_FILL`` of its largest servers (a course of GPU slices, a 512-GPU platform) has
its per-user caps and first servers started here, and its quota arithmetic held by
the admission tests alone.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from hub_helpers import api, hub_account
from jupyterhub_gpu.core.model import Amounts, Group, Policy
from jupyterhub_gpu.core.quantities import parse_quantity
from jupyterhub_gpu.core.selection import Refused, Request, Selection, offers, select
from jupyterhub_gpu_dev.demo import HUB_NAMESPACE, DemoPlan, plan_demo, reconcile_once
from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster
from jupyterhub_gpu_dev.localcluster.hub import LocalHub
from kube_helpers import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["university", "department", "enterprise"]
#: at most this many servers fill one group to its limit (each is a JupyterLab process)
MAX_FILL = 8
#: a member's extra servers tried against the per-user caps before the test gives up
#: on finding the cap that refuses (none binds a member of such a group)
MAX_EXTRA = 3


def values(example: str) -> list[str]:
    return [str(ROOT / "helm-values/base.yaml"), str(ROOT / f"helm-values/{example}.yaml")]


# ---- the promises, read from the values (pure) ----------------------------------------


def gpu_selections(policy: Policy, group: Group) -> list[Selection]:
    """Every GPU server a member of ``group`` may start, as the hub selects it: each of
    the group's GPU profiles with each flavor and GPU count its options allow."""
    found = []
    for offer in offers(policy, [group.name]):
        if offer.group is not group or offer.profile.gpu is None:
            continue
        flavors = [None, *(k for k, _ in getattr(offer.options.get("flavor"), "choices", ()))]
        counts = [None, *(k for k, _ in getattr(offer.options.get("gpus"), "choices", ()))]
        for flavor in flavors:
            for count in counts:
                chosen = {"flavor": flavor, "gpus": count}
                options = {k: v for k, v in chosen.items() if v is not None}
                try:
                    found.append(select(policy, [group.name], {"profile": offer.slug, **options}))
                except Refused:
                    continue
    return found


def plus(held: Request, more: Request) -> Request:
    devices = dict(held.devices)
    for flavor, units in more.devices:
        devices[flavor] = devices.get(flavor, 0) + units
    return Request(
        gpus=held.gpus + more.gpus,
        cpu=held.cpu + more.cpu,
        memory=held.memory + more.memory,
        servers=held.servers + more.servers,
        devices=tuple(sorted(devices.items())),
    )


NOTHING = Request(servers=0)


def gpu_caps(caps: Amounts) -> Amounts:
    """What a quota or limit promises: its GPUs and device counts (its CPUs and memory
    are there to let them be reached, not to stop short of them)."""
    return Amounts(gpus=caps.gpus, flavors=caps.flavors)


@dataclass
class Spawn:
    """One server a test member asks for, and what the values promise of it."""

    user: str
    server: str  # "" for the default server, else a named one
    selection: Selection
    expect: str  # "in-quota", "over-quota" or "refused"
    #: for a refusal: the numbers the refusal gives (in use, needed, the cap)
    numbers: tuple[str, ...] = ()
    why: str = ""


@dataclass
class GroupPlan:
    group: Group
    spawns: list[Spawn] = field(default_factory=list)
    #: filled to its limit here (else: too many servers for this test, see MAX_FILL)
    filled: bool = False


class Usage:
    """What each group and member holds as the plan's servers start."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.groups: dict[str, Request] = {}
        self.users: dict[str, Request] = {}

    def of_level(self, level: Group) -> Request:
        """What ``level`` holds: its own and its children's servers."""
        held = NOTHING
        for name, usage in self.groups.items():
            if level.name in {g.name for g in self.policy.ancestors(name)}:
                held = plus(held, usage)
        return held

    def decide(self, group: Group, user: str, request: Request) -> tuple[str, tuple, str]:
        """What the values promise for ``request``: its tier, or the refusal's numbers."""
        mine = self.users.get(user, NOTHING)
        passed = group.per_user.first_passed(request, mine)
        if passed and passed.unit == "servers":
            # a server needs one server: the refusal says how many run, and the cap
            return "refused", (passed.in_use, passed.cap), "per_user"
        if passed:
            return "refused", (passed.in_use, passed.need, passed.cap), "per_user"
        levels = [lvl for lvl in self.policy.ancestors(group.name) if not lvl.unlimited]
        for level in levels:
            passed = gpu_caps(level.limit).first_passed(request, self.of_level(level))
            if passed:
                return "refused", (passed.in_use, passed.need, passed.cap), f"{level.name} limit"
        in_quota = all(
            gpu_caps(level.quota).first_passed(request, self.of_level(level)) is None
            for level in levels
        )
        return ("in-quota" if in_quota else "over-quota"), (), ""

    def add(self, group: Group, user: str, request: Request) -> None:
        self.groups[group.name] = plus(self.groups.get(group.name, NOTHING), request)
        self.users[user] = plus(self.users.get(user, NOTHING), request)


def group_plan(policy: Policy, group: Group, named_servers: bool, usage: Usage) -> GroupPlan:
    """The servers that show ``group``'s promises, in order (``usage`` carries what the
    example's earlier groups hold, for shared parents)."""
    plan = GroupPlan(group)
    choices = gpu_selections(policy, group)
    largest = max(choices, key=lambda s: (s.request.gpus, -s.request.cpu, -s.request.memory))
    smallest = min(choices, key=lambda s: (s.request.gpus, s.request.cpu, s.request.memory))
    users = (f"{group.name.lower()}-{i}" for i in range(1, 1000))

    def ask(user: str, server: str, selection: Selection) -> Spawn:
        expect, numbers, why = usage.decide(group, user, selection.request)
        if expect != "refused":
            usage.add(group, user, selection.request)
        spawn = Spawn(user, server, selection, expect, numbers, why)
        plan.spawns.append(spawn)
        return spawn

    first = next(users)
    assert ask(first, "", largest).expect == "in-quota", f"{group.name}: its first server"
    if named_servers:  # per-user caps: more servers beside the first, until refused
        for n in range(1, MAX_EXTRA + 1):
            if ask(first, f"extra-{n}", smallest).expect == "refused":
                break
    # quota and burst: the largest servers, each for a new member, up to the limit
    trial = Usage(policy)
    trial.groups, trial.users = dict(usage.groups), dict(usage.users)
    needed = 0
    while trial.decide(group, f"trial-{needed}", largest.request)[0] != "refused":
        trial.add(group, f"trial-{needed}", largest.request)
        needed += 1
        if needed > MAX_FILL:
            return plan
    for user in users:
        if ask(user, "", largest).expect == "refused":
            break
    plan.filled = True
    return plan


def promises(plan: DemoPlan) -> list[GroupPlan]:
    """The plan of every group of the example that promises GPUs (a quota, not
    unlimited), in policy order."""
    named = bool((plan.hub_config.get("JupyterHub") or {}).get("allow_named_servers"))
    usage = Usage(plan.policy)
    return [
        group_plan(plan.policy, group, named, usage)
        for group in plan.policy.groups.values()
        if not group.unlimited and group.quota.gpus and gpu_selections(plan.policy, group)
    ]


def test_the_promises_are_read_from_each_examples_values():
    """What the cluster test below starts, for every example: each GPU group's first
    server in quota, every filled group ends on a refusal at one of its own caps, and
    every example has a group filled to its limit or a per-user cap that refuses."""
    for example in EXAMPLES:
        plan = plan_demo(values(example))
        plans = promises(plan)
        assert plans, example
        assert any(p.filled or any(s.why == "per_user" for s in p.spawns) for p in plans)
        for group_plan_ in plans:
            assert group_plan_.spawns[0].expect == "in-quota", group_plan_.group.name
            if group_plan_.filled:
                last = group_plan_.spawns[-1]
                assert last.expect == "refused", group_plan_.group.name
                assert last.why.endswith(" limit"), last


# ---- on the local cluster ------------------------------------------------------------


@dataclass
class ExampleHub:
    example: str
    plan: DemoPlan
    cluster: LocalCluster
    hub: LocalHub
    core: client.CoreV1Api


@pytest.fixture(scope="module", params=EXAMPLES)
async def example_hub(request, tmp_path_factory, built):
    """The example on a cluster of its own, as ``jupyterhub-gpu demo VALUES`` runs it:
    the derived nodes, the scheduler, the reconciled objects, and the hub in the
    demo's namespace with the example's policy and hub.config."""
    example = request.param
    plan = plan_demo(values(example))
    users = {
        spawn.user: [group_plan_.group.name]
        for group_plan_ in promises(plan)
        for spawn in group_plan_.spawns
    }
    cluster = await asyncio.to_thread(
        LocalCluster.create,
        name=f"pytest-promises-{example}-{os.getpid()}",
        directory=tmp_path_factory.mktemp(f"promises-{example}"),
        node_pools=plan.node_pools,
        stand_in_schedulers=plan.stand_ins,
        schedulers=plan.schedulers,
    )
    hub = None
    try:
        await reconcile_once(cluster, plan.policy, plan.crds)
        async with cluster.api() as kube:
            core = client.CoreV1Api(kube)
            # the hub's service account with z2jh's Role and the rendered RBAC
            kubeconfig = await hub_account(cluster, core, HUB_NAMESPACE, plan.policy_values)
            hub = LocalHub(
                cluster,
                namespace=HUB_NAMESPACE,
                users=users,
                policy=plan.policy_values,
                hub_config=plan.hub_config,
                z2jh_layout=True,
                kubeconfig=kubeconfig,
                extra_config=(
                    # servers start one by one on two shared cores
                    "c.KubeSpawner.http_timeout = 120\nc.KubeSpawner.start_timeout = 180\n"
                ),
            )
            await asyncio.to_thread(hub.start, 120)
            yield ExampleHub(example, plan, cluster, hub, core)
    finally:
        if hub is not None:
            await asyncio.to_thread(hub.stop)
        await asyncio.to_thread(cluster.down)


async def server_model(hub: LocalHub, user: str, server: str) -> dict | None:
    _, model = await api(hub, "GET", f"/users/{user}")
    return (model.get("servers") or {}).get(server)


async def spawn(hub: LocalHub, spawn: Spawn) -> tuple[int, dict]:
    path = (
        f"/users/{spawn.user}/servers/{spawn.server}"
        if spawn.server
        else (f"/users/{spawn.user}/server")
    )
    return await asyncio.to_thread(hub.api, "POST", path, spawn.selection.user_options, None, 120)


async def running_pod(core: client.CoreV1Api, spawn: Spawn) -> dict:
    """The server's pod once it runs (API JSON), wherever its group's namespace is."""
    selector = f"hub.jupyter.org/username={spawn.user}"

    async def running():
        pods = await core.list_pod_for_all_namespaces(label_selector=selector)
        for pod in pods.items:
            name = (pod.metadata.labels or {}).get("hub.jupyter.org/servername", "")
            if name == spawn.server and pod.status.phase == "Running":
                return core.api_client.sanitize_for_serialization(pod)
        return None

    return await eventually(running, f"{spawn.user}'s server {spawn.server!r} to run", within=180)


async def assert_started(ready: ExampleHub, spawn: Spawn) -> None:
    """The server is ready in the hub, its pod runs on a node offering its flavor with
    the tier the values promise, and it has exactly its profile's CPUs and memory."""
    hub, core = ready.hub, ready.core

    async def is_ready():
        model = await server_model(hub, spawn.user, spawn.server)
        return bool(model and model["ready"])

    await eventually(is_ready, f"{spawn.user}'s server {spawn.server!r} to be ready", within=180)
    pod = await running_pod(core, spawn)
    labels = pod["metadata"]["labels"]
    what = f"{ready.example}: {spawn.user}'s {spawn.selection.user_options}"
    assert labels["gpu.jupyterhub.org/group"] == spawn.selection.group.name, what
    assert labels["gpu.jupyterhub.org/tier"] == spawn.expect, what
    profile, flavor = spawn.selection.profile, spawn.selection.flavor
    resources = pod["spec"]["containers"][0]["resources"]
    cpu_limit = profile.cpu_limit or profile.cpu
    memory_limit = profile.memory_limit or profile.memory
    assert parse_quantity(resources["requests"]["cpu"]) * 1000 == profile.cpu, what
    assert parse_quantity(resources["limits"]["cpu"]) * 1000 == cpu_limit, what
    assert parse_quantity(resources["requests"]["memory"]) == profile.memory, what
    assert parse_quantity(resources["limits"]["memory"]) == memory_limit, what
    node = await core.read_node(pod["spec"]["nodeName"])
    node_labels = node.metadata.labels or {}
    assert {k: node_labels.get(k) for k in flavor.node_selector} == dict(flavor.node_selector)
    if flavor.kind == "fraction":
        # KAI's slice: an annotation, no device request (the local cluster's stand-in for
        # KAI places it as kube-scheduler would, without KAI's GPU sharing)
        assert pod["metadata"]["annotations"]["gpu-memory"] == str(flavor.gpu_memory), what
        assert not any(k.startswith("nvidia.com/") for k in resources["limits"]), what
    elif flavor.node_resource:
        assert flavor.node_resource in node.status.allocatable, what
        assert resources["limits"][flavor.node_resource] == str(spawn.selection.count), what


async def test_every_groups_promises_hold_on_the_local_cluster(example_hub):
    ready = example_hub
    for group_plan_ in promises(ready.plan):
        for step in group_plan_.spawns:
            status, body = await spawn(ready.hub, step)
            what = (
                f"{ready.example}: {step.user} ({step.server or 'default'}) asking "
                f"{step.selection.user_options}, promised {step.expect} {step.why}"
            )
            if step.expect == "refused":
                assert status == 403, f"{what}: {status} {body}"
                message = body["message"]
                # a count of one is written as a word ("your one Students server")
                numbers = re.findall(r"\d+(?:\.\d+)?", re.sub(r"\bone\b", "1", message))
                # the numbers: what is in use, what this server needs, and the cap
                for number in step.numbers:
                    assert re.sub(r"[^\d.]", "", number) in numbers, f"{what}: {message}"
                continue
            assert status in (201, 202), f"{what}: {status} {body}"
            await assert_started(ready, step)
