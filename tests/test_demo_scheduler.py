"""`jupyterhub-gpu demo --scheduler kueue`: the built-in example with a real Kueue.

The demo runs the scheduler its policy names when the local cluster can run it
(``--scheduler`` for the built-in example; values files that name it get it
without the option) and stands kube-scheduler in for any other. End to end: a
GPU server spawned through the hub's REST API waits at Kueue's admission gate,
is admitted by its group's ClusterQueue, and runs; Ctrl-C stops Kueue with the
rest. The planning (which schedulers the cluster runs) is checked without a cluster.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cli_helpers import ROOT, cli
from demo_helpers import Demo, api, cmdline, processes_under, still_running
from jupyterhub_gpu.dev.demo import SCHEDULER_ROLES, DemoError, plan_demo
from jupyterhub_gpu.dev.localcluster.build import SCHEDULER_COMPONENTS, ensure_binaries
from jupyterhub_gpu.dev.localcluster.cluster import free_port
from jupyterhub_gpu.dev.localcluster.kubeconfig import load_configuration
from kube_helpers import eventually

KUEUE = ("kueue.x-k8s.io", "v1beta2")
KUEUE_VERSION = SCHEDULER_COMPONENTS["kueue"].version


def values(example: str) -> list[str]:
    return [str(ROOT / "helm-values/base.yaml"), str(ROOT / f"helm-values/{example}.yaml")]


# ---- which schedulers the demo's cluster runs, decided before anything starts --------


def test_the_built_in_demo_runs_plain_kube_scheduler_without_the_option():
    plan = plan_demo()
    assert plan.policy.scheduler.name == "default"
    assert plan.schedulers == ()
    assert not [note for note in plan.notes if note.startswith("scheduler:")]


@pytest.mark.parametrize("scheduler", list(SCHEDULER_COMPONENTS))
def test_the_option_runs_the_built_in_example_with_a_scheduler_the_cluster_runs(scheduler):
    plan = plan_demo(scheduler=scheduler)
    assert plan.policy.scheduler.name == scheduler
    assert plan.schedulers == (scheduler,)
    # the real one places nothing under a borrowed name, and brings its own CRDs
    assert plan.stand_ins == ()
    assert plan.crds is None
    assert any(
        f"scheduler: {scheduler} " in note and "runs for real" in note for note in plan.notes
    )
    # and says who places the pods: kube-scheduler after Kueue, Volcano itself
    assert any(SCHEDULER_ROLES[scheduler] in note for note in plan.notes)


def test_values_naming_kueue_get_a_real_kueue_and_kai_keeps_its_stand_in():
    enterprise = plan_demo(values("enterprise"))  # scheduler: {name: kueue}
    assert enterprise.schedulers == ("kueue",)
    assert not any("runs no kueue" in note for note in enterprise.notes)
    # the same with the option that names it
    assert plan_demo(values("enterprise"), scheduler="kueue").schedulers == ("kueue",)

    university = plan_demo(values("university"))  # scheduler: {name: kai}
    assert university.schedulers == ()
    assert university.stand_ins == ("kai-scheduler",)
    assert university.crds == "kai"
    assert any("the local cluster runs no kai" in note for note in university.notes)


def test_a_scheduler_option_other_than_the_values_one_is_refused_naming_both():
    result = cli("demo", *values("university"), "--scheduler", "kueue", "--port", "1")
    assert result.returncode == 1
    assert "--scheduler kueue: the policy in" in result.stderr, result.stderr
    assert "names scheduler kai (hub.config.GPUPolicy.scheduler.name)" in result.stderr
    assert "drop --scheduler" in result.stderr
    assert "starting etcd" not in result.stderr
    assert "Traceback" not in result.stderr
    # one the local cluster cannot run is not a choice
    result = cli("demo", "--scheduler", "kai")
    assert result.returncode == 2
    assert "invalid choice: 'kai'" in result.stderr
    with pytest.raises(DemoError, match="--scheduler kai: the local cluster cannot run it"):
        plan_demo(scheduler="kai")


# ---- end to end -------------------------------------------------------------------


async def admitted_workload(demo: Demo, user: str) -> tuple[dict, dict]:
    """The user's running server pod and the Kueue Workload that admitted it (API JSON)."""
    from kubernetes_asyncio import client

    async with client.ApiClient(await load_configuration(demo.kubeconfig)) as api_client:
        core = client.CoreV1Api(api_client)
        custom = client.CustomObjectsApi(api_client)

        async def running():
            pods = await core.list_pod_for_all_namespaces(
                label_selector=f"hub.jupyter.org/username={user}"
            )
            return next((p for p in pods.items if p.status.phase == "Running"), None)

        pod = await eventually(running, f"{user}'s server pod to run", within=180)
        workloads = await custom.list_namespaced_custom_object(
            *KUEUE, pod.metadata.namespace, "workloads"
        )
        mine = [
            w
            for w in workloads["items"]
            if any(o["uid"] == pod.metadata.uid for o in w["metadata"].get("ownerReferences", []))
        ]
        return api_client.sanitize_for_serialization(pod), (mine[0] if mine else {})


@pytest.mark.k8s
@pytest.mark.hub
async def test_demo_scheduler_kueue_admits_a_gpu_server_through_kueue_and_ctrl_c_stops_it(built):
    ensure_binaries(schedulers=("kueue",))  # the demo's start-up timeout is about starting
    demo = Demo(free_port(), "--scheduler", "kueue")
    try:
        demo.wait_until_up(timeout=300)
        token = demo.wait_for(r"JUPYTERHUB_API_TOKEN=(\S+)", timeout=5).group(1)
        # progress and banner say that Kueue runs for real, and how to look at it
        assert "starting Kueue" in demo.output
        banner = demo.output[demo.output.index("is running at") :]
        assert f"scheduler: kueue {KUEUE_VERSION}, running for real" in banner, banner
        assert "kubectl get clusterqueues,localqueues,workloads -A" in banner
        assert "with scheduler: {name: kueue} (--scheduler)" in banner
        assert "kube-scheduler places the pods" not in demo.output  # no stand-in
        processes = processes_under(demo.process.pid)
        kueue = [pid for pid in processes if Path(cmdline(pid).split(" ")[0]).name == "kueue"]
        assert len(kueue) == 1, [cmdline(pid) for pid in processes]

        # a research GPU server, through the hub's REST API with the printed admin token
        status, body = await asyncio.to_thread(
            api, demo, token, "POST", "/users/research-1/server", {"profile": "research--research"}
        )
        assert status in (201, 202), body

        async def ready():
            _, model = await asyncio.to_thread(api, demo, token, "GET", "/users/research-1")
            found = model["servers"].get("")
            return bool(found and found["ready"])

        await eventually(ready, "research-1's server ready", within=180)
        pod, workload = await admitted_workload(demo, "research-1")
        labels = pod["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/queue-name"] == "research"
        assert labels["kueue.x-k8s.io/managed"] == "true"  # Kueue took the pod on
        assert not pod["spec"].get("schedulingGates")  # and lifted its gate
        # Kueue's own record: the research ClusterQueue admitted it
        assert workload, f"no Kueue Workload owned by {pod['metadata']['name']}"
        conditions = {c["type"]: c["status"] for c in workload["status"]["conditions"]}
        assert conditions.get("Admitted") == "True", workload["status"]
        assert workload["status"]["admission"]["clusterQueue"] == "research"

        # Ctrl-C: Kueue stops with the hub, its server and the cluster
        processes = processes_under(demo.process.pid)
        assert set(kueue) <= set(processes)
        assert demo.interrupt() == 0, demo.output
        assert "stopped; nothing is left running" in demo.output
        assert "Traceback" not in demo.output
        assert still_running(processes) == []
        assert not demo.cluster_dir.exists()
        assert not demo.hub_dir.exists()
    finally:
        demo.make_sure_it_is_gone()
