"""`jupyterhub-gpu demo VALUES...`: an admin rehearses their own values on a local replica.

For each example cluster's values, the demo starts as the admin would run it; each
demo user's spawn page offers exactly what `jupyterhub-gpu profiles` says for that
user's groups; and a GPU server started through the REST API with the printed admin
token runs on a simulated node that offers its flavor. Broken values and node pools
stop the demo before anything starts.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
from pathlib import Path

import pytest
import yaml

from cli_helpers import cli
from demo_helpers import Demo, api
from hub_helpers import page_as
from jupyterhub_gpu.config.values import policy_from_values
from jupyterhub_gpu.core.capacity import flavor_capacity
from jupyterhub_gpu.core.dra import DraInventory
from jupyterhub_gpu.core.quantities import parse_quantity
from jupyterhub_gpu_dev.demo import plan_demo, stand_in_claims
from jupyterhub_gpu_dev.localcluster.cluster import free_port
from jupyterhub_gpu_dev.localcluster.dra import device_classes, render_resource_slices
from jupyterhub_gpu_dev.localcluster.kubeconfig import load_configuration
from jupyterhub_gpu_dev.localcluster.nodepools import render_nodes
from kube_helpers import eventually

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "jupyterhub-gpu"

#: per example: the demo user who starts a GPU server, and the profile they start
GPU_SERVER = {
    "university": ("research-1", "research--research"),
    "department": ("cpshpcaccess-1", "cpsHPCAccess--mig"),
    "enterprise": ("interns-1", "interns--light"),
}


def values(example: str) -> list[str]:
    return [str(ROOT / "helm-values/base.yaml"), str(ROOT / f"helm-values/{example}.yaml")]


def profiles_command(example: str, groups: list[str]) -> list[str]:
    """The slugs `jupyterhub-gpu profiles --json` says a member of ``groups`` is offered."""
    result = cli("profiles", *values(example), "--groups", ",".join(groups), "--json")
    assert result.returncode == 0, result.stderr
    return [entry["slug"] for entry in json.loads(result.stdout)]


def spawn_form_slugs(url: str, user: str) -> list[str]:
    """Log in through the hub's login form as a browser would; the spawn form's profiles."""
    page = page_as(url, user, PASSWORD)
    return [html.unescape(s) for s in re.findall(r'name="profile"[^>]*value="([^"]+)"', page)]


async def running_pod(demo: Demo, user: str) -> tuple[dict, dict]:
    """The user's server pod once it runs, and the node it runs on (API JSON)."""
    from kubernetes_asyncio import client

    async with client.ApiClient(await load_configuration(demo.kubeconfig)) as api_client:
        core = client.CoreV1Api(api_client)

        async def running():
            pods = await core.list_pod_for_all_namespaces(
                label_selector=f"hub.jupyter.org/username={user}"
            )
            return next((p for p in pods.items if p.status.phase == "Running"), None)

        pod = await eventually(running, f"{user}'s server pod to run", within=180)
        node = await core.read_node(pod.spec.node_name)
        return (
            api_client.sanitize_for_serialization(pod),
            api_client.sanitize_for_serialization(node),
        )


async def claim_phases(demo: Demo, claims: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The phase of each (namespace, claim), once none is Pending any more."""
    from kubernetes_asyncio import client

    if not claims:
        return {}

    async with client.ApiClient(await load_configuration(demo.kubeconfig)) as api_client:
        core = client.CoreV1Api(api_client)

        async def settled():
            phases = {
                (ns, name): (
                    await core.read_namespaced_persistent_volume_claim(name, ns)
                ).status.phase
                for ns, name in claims
            }
            return phases if "Pending" not in phases.values() else None

        return await eventually(settled, "the stand-in claims to bind", within=60)


def user_group(plan, user: str) -> str:
    (group,) = plan.users[user]
    return group


@pytest.mark.k8s
@pytest.mark.hub
@pytest.mark.parametrize("example", list(GPU_SERVER))
async def test_a_demo_of_an_examples_values_offers_what_profiles_says_and_runs_a_gpu_server(
    built, example
):
    plan = plan_demo(values(example))
    demo = Demo(free_port(), *values(example))
    try:
        demo.wait_until_up(timeout=300)
        token = demo.wait_for(r"JUPYTERHUB_API_TOKEN=(\S+)", timeout=5).group(1)
        for line in plan.notes:  # what the demo does differently, said before it starts
            assert line in demo.output
        # every demo user: the banner's row, and the spawn page's offer
        for user, groups in plan.users.items():
            assert re.search(rf"^\s+{re.escape(user)}\s", demo.output, re.MULTILINE)
            expected = profiles_command(example, groups)
            assert await asyncio.to_thread(spawn_form_slugs, demo.url, user) == expected, user

        user, profile = GPU_SERVER[example]
        status, body = await asyncio.to_thread(
            api, demo, token, "POST", f"/users/{user}/server", {"profile": profile}
        )
        assert status in (201, 202), body
        pod, node = await running_pod(demo, user)
        flavor = plan.policy.flavors[pod["metadata"]["labels"]["gpu.jupyterhub.org/flavor"]]
        # the node it runs on offers the flavor the way the hardware would
        labels = node["metadata"]["labels"]
        assert {k: labels.get(k) for k in flavor.node_selector} == dict(flavor.node_selector)
        assert parse_quantity(node["status"]["allocatable"][flavor.node_resource]) >= 1
        requests = pod["spec"]["containers"][0]["resources"]["requests"]
        assert requests[flavor.node_resource] == "1"
        assert labels["jupyterhub-gpu.local/pool"] == f"flavor-{flavor.name}"
        if plan.policy.scheduler.name == "kueue":  # a real Kueue runs, and admitted it
            assert plan.schedulers == ("kueue",)
            assert "starting Kueue" in demo.output
            assert pod["metadata"]["labels"]["kueue.x-k8s.io/managed"] == "true"
        if plan.policy.scheduler.name == "kai":  # the pod names KAI; a stand-in placed it
            assert pod["spec"]["schedulerName"] == "kai-scheduler"
            assert pod["metadata"]["labels"]["kai.scheduler/queue"]
        # the claims the groups' datasets name: empty stand-ins, bound, where servers run
        assert await claim_phases(demo, stand_in_claims(plan.policy)) == {
            claim: "Bound" for claim in stand_in_claims(plan.policy)
        }
        claims = {
            v["persistentVolumeClaim"]["claimName"]
            for v in pod["spec"].get("volumes") or []
            if "persistentVolumeClaim" in v
        }
        assert claims == {d.claim for d in plan.policy.datasets_of(user_group(plan, user))} - {None}
    finally:
        demo.make_sure_it_is_gone()


@pytest.mark.parametrize("example", list(GPU_SERVER))
def test_the_derived_node_pools_are_printed_and_start_nothing(example):
    result = cli("demo", *values(example), "--print-node-pools")
    assert result.returncode == 0, result.stderr
    assert "starting etcd" not in result.stderr
    description = yaml.safe_load(result.stdout)
    nodes = render_nodes(description)
    policy = policy_from_values(values(example))
    # a dra flavor's devices are in the printed DRA pools' ResourceSlices
    devices = DraInventory(render_resource_slices(description), device_classes(description))
    capacity = flavor_capacity(policy, nodes, [], dra=devices)
    for flavor in policy.flavors.values():
        offering = [
            n
            for n in nodes
            if all(n["metadata"]["labels"].get(k) == v for k, v in flavor.node_selector.items())
            and (flavor.node_resource or "") in n["status"]["allocatable"]
        ]
        if flavor.kind == "dra":
            assert capacity[flavor.name].allocatable, f"{example}: no device for {flavor.name}"
            continue
        assert offering, f"{example}: no printed node offers {flavor.name}"


def test_broken_values_stop_the_demo_before_anything_starts(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        yaml.safe_dump(
            {
                "hub": {
                    "config": {
                        "GPUPolicy": {
                            "profiles": {"p": {"cpu": "lots"}},
                            "groups": {"lab": {"quota": {"gpus": "ten"}, "profiles": ["q"]}},
                        }
                    }
                }
            }
        )
    )
    result = cli("demo", str(ROOT / "helm-values/base.yaml"), str(broken), "--port", "1")
    assert result.returncode == 1
    for error in (
        "hub.config.GPUPolicy.groups.lab.quota.gpus: expected a number, got 'ten'",
        "hub.config.GPUPolicy.profiles.p.cpu:",
        "hub.config.GPUPolicy.groups.lab.profiles",
    ):
        assert error in result.stderr, result.stderr
    assert "starting etcd" not in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_node_pools_name_the_line_and_start_nothing(tmp_path):
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "node_pools:\n"
        "  a100:\n"
        "    count: 2\n"
        "    cpu: 32\n"
        "    memory: 256Gi\n"
        "    gpu: {product: NVIDIA-A100-SXM4-40GB, memory: 40960, count: two}\n"
    )
    result = cli("demo", *values("department"), "--node-pools", str(pools))
    assert result.returncode == 1
    assert f"--node-pools {pools}:6: node_pools.a100.gpu.count: expected int" in result.stderr
    assert "starting etcd" not in result.stderr

    pools.write_text("node_pools:\n  a100: [\n")
    result = cli("demo", *values("department"), "--node-pools", str(pools))
    assert result.returncode == 1
    assert f"--node-pools {pools}:" in result.stderr
    assert "not YAML" in result.stderr


def test_values_without_a_policy_say_what_to_start_from(tmp_path):
    bare = tmp_path / "bare.yaml"
    bare.write_text("hub:\n  config:\n    JupyterHub: {admin_access: true}\n")
    result = cli("demo", str(bare))
    assert result.returncode == 1
    assert f"{bare}: no hub.config.GPUPolicy to demo; start from helm-values/base.yaml" in (
        result.stderr
    )


def test_the_demo_says_what_to_install_when_its_servers_cannot_run(tmp_path):
    """Installed without what its servers run (JupyterLab), the demo would start and every
    spawn would end in the hub's own error; it stops before starting anything, naming
    the install."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    hide_jupyterlab = (
        "import sys; sys.modules['jupyterlab'] = None; "
        "from jupyterhub_gpu.cli import main; sys.exit(main(['demo']))"
    )
    # this checkout's code; and no binaries, so that were the check ever to pass, the
    # demo fails at once instead of starting a cluster this test would leave behind
    (tmp_path / "no-binaries").mkdir()
    checkout = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            str(checkout / folder) for folder in ("", "jupyterhub-gpu-dev")
        ),
        "JUPYTERHUB_GPU_BIN_DIR": str(tmp_path / "no-binaries"),
    }
    result = subprocess.run(
        [sys.executable, "-c", hide_jupyterlab],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 1, result.stdout
    assert (
        "the demo's servers run JupyterLab on this machine, which is not installed: "
        "the local cluster and the demo come with the jupyterhub-gpu-dev distribution"
    ) in result.stderr
    # nothing was started: no cluster state was written
    assert "starting" not in result.stderr
