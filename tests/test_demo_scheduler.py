"""`jupyterhub-gpu demo --scheduler kueue|volcano`: the built-in example, real scheduler.

The demo runs the scheduler its policy names when the local cluster can run it
(``--scheduler`` for the built-in example; values files that name it get it
without the option) and stands kube-scheduler in for any other. End to end, for
each: a GPU server spawned through the hub's REST API is admitted by its group's
queue (Kueue's ClusterQueue; Volcano's Queue, through a PodGroup) and runs;
Ctrl-C stops the scheduler with the rest. The planning (which schedulers the
cluster runs) is checked without a cluster.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cli_helpers import ROOT, cli
from demo_helpers import Demo, api, cmdline, processes_under, still_running
from jupyterhub_gpu_dev.demo import SCHEDULER_OBJECTS, SCHEDULER_ROLES, DemoError, plan_demo
from jupyterhub_gpu_dev.localcluster.build import SCHEDULER_COMPONENTS, ensure_binaries
from jupyterhub_gpu_dev.localcluster.cluster import free_port
from jupyterhub_gpu_dev.localcluster.kubeconfig import load_configuration
from kube_helpers import eventually

KUEUE = ("kueue.x-k8s.io", "v1beta2")


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

#: the processes each scheduler runs as in the local cluster
PROCESSES = {"kueue": {"kueue"}, "volcano": {"vc-scheduler", "vc-controller-manager"}}


async def running_pod(api_client, user: str):
    from kubernetes_asyncio import client

    async def running():
        pods = await client.CoreV1Api(api_client).list_pod_for_all_namespaces(
            label_selector=f"hub.jupyter.org/username={user}"
        )
        return next((p for p in pods.items if p.status.phase == "Running"), None)

    return await eventually(running, f"{user}'s server pod to run", within=180)


async def admitted_by_kueue(api_client, pod) -> None:
    """Kueue took the pod on, lifted its gate, and its Workload was admitted by the
    research ClusterQueue."""
    from kubernetes_asyncio import client

    workloads = await client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        *KUEUE, pod.metadata.namespace, "workloads"
    )
    mine = [
        w
        for w in workloads["items"]
        if any(o["uid"] == pod.metadata.uid for o in w["metadata"].get("ownerReferences", []))
    ]
    labels = pod.metadata.labels
    assert labels["kueue.x-k8s.io/queue-name"] == "research"
    assert labels["kueue.x-k8s.io/managed"] == "true"
    assert not pod.spec.scheduling_gates
    assert mine, f"no Kueue Workload owned by {pod.metadata.name}"
    conditions = {c["type"]: c["status"] for c in mine[0]["status"]["conditions"]}
    assert conditions.get("Admitted") == "True", mine[0]["status"]
    assert mine[0]["status"]["admission"]["clusterQueue"] == "research"


async def placed_by_volcano(api_client, pod) -> None:
    """Volcano grouped the pod in the research queue, let it in and placed it."""
    from kubernetes_asyncio import client

    assert pod.spec.scheduler_name == "volcano"
    assert pod.metadata.annotations["scheduling.volcano.sh/queue-name"] == "research"
    group = await client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        "scheduling.volcano.sh",
        "v1beta1",
        pod.metadata.namespace,
        "podgroups",
        pod.metadata.annotations["scheduling.k8s.io/group-name"],
    )
    assert group["spec"]["queue"] == "research"
    assert group["status"]["phase"] in ("Inqueue", "Running"), group["status"]


ADMITTED_BY = {"kueue": admitted_by_kueue, "volcano": placed_by_volcano}


@pytest.mark.k8s
@pytest.mark.hub
@pytest.mark.parametrize("scheduler", list(SCHEDULER_COMPONENTS))
async def test_demo_scheduler_runs_a_gpu_server_through_the_real_scheduler_and_ctrl_c_stops_it(
    built, scheduler
):
    ensure_binaries(schedulers=(scheduler,))  # the demo's start-up timeout is about starting
    demo = Demo(free_port(), "--scheduler", scheduler)
    try:
        demo.wait_until_up(timeout=300)
        token = demo.wait_for(r"JUPYTERHUB_API_TOKEN=(\S+)", timeout=5).group(1)
        # progress and banner say that the scheduler runs for real, and how to look at it
        assert f"starting {scheduler.capitalize()}" in demo.output
        banner = demo.output[demo.output.index("is running at") :]
        version = SCHEDULER_COMPONENTS[scheduler].version
        assert f"scheduler: {scheduler} {version}, running for real" in banner, banner
        assert f"kubectl get {SCHEDULER_OBJECTS[scheduler]} -A" in banner
        assert f"with scheduler: {{name: {scheduler}}} (--scheduler)" in banner
        assert "kube-scheduler places the pods" not in demo.output  # no stand-in
        processes = processes_under(demo.process.pid)
        ours = [
            pid
            for pid in processes
            if Path(cmdline(pid).split(" ")[0]).name in PROCESSES[scheduler]
        ]
        assert len(ours) == len(PROCESSES[scheduler]), [cmdline(pid) for pid in processes]

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
        from kubernetes_asyncio import client

        async with client.ApiClient(await load_configuration(demo.kubeconfig)) as api_client:
            pod = await running_pod(api_client, "research-1")
            await ADMITTED_BY[scheduler](api_client, pod)

        # Ctrl-C: the scheduler stops with the hub, its server and the cluster
        processes = processes_under(demo.process.pid)
        assert set(ours) <= set(processes)
        assert demo.interrupt() == 0, demo.output
        assert "stopped; nothing is left running" in demo.output
        assert "Traceback" not in demo.output
        assert still_running(processes) == []
        assert not demo.cluster_dir.exists()
        assert not demo.hub_dir.exists()
    finally:
        demo.make_sure_it_is_gone()
