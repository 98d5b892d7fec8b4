"""Plain-language reasons for a Pending server (pure; with a real scheduler: test_hub_failures)."""

from __future__ import annotations

from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.pending import (
    explain_unschedulable,
    gated_by_kueue,
    kueue_position,
    kueue_queue_line,
    podgroup_of,
    volcano_position,
    volcano_queue_line,
    workload_of,
)

POLICY = parse_policy(
    flavors={
        "h200": {"kind": "gpu", "display_name": "H200"},
        "mig-1g": {"kind": "mig", "profile": "1g.5gb", "strategy": "mixed"},
    }
)
H200 = POLICY.flavors["h200"]
MIG = POLICY.flavors["mig-1g"]


def test_gpus_all_in_use_says_it_will_start_when_one_frees():
    message = (
        "0/9 nodes are available: 3 Insufficient nvidia.com/gpu, "
        "6 node(s) didn't match Pod's node affinity/selector. preemption: 0/9 nodes are "
        "available: 3 No preemption victims found for incoming pod, "
        "6 Preemption is not helpful for scheduling."
    )
    text = explain_unschedulable(message, H200, ("nvidia.com/gpu",))
    assert text == (
        "Waiting for a free H200: all of them are in use (3 nodes with H200 are full). "
        "The server starts by itself as soon as there is room; stop it to give up."
    )


def test_no_node_with_the_flavor_asks_an_admin():
    message = "0/9 nodes are available: 9 node(s) didn't match Pod's node affinity/selector."
    text = explain_unschedulable(message, MIG, ("nvidia.com/mig-1g.5gb",))
    assert text.startswith("No node in the cluster can run mig-1g (9 nodes checked")
    assert "Ask an admin" in text


def test_cpu_shortage_is_named_with_the_gpu_one():
    message = (
        "0/4 nodes are available: 1 Insufficient cpu, 1 Insufficient nvidia.com/gpu, "
        "2 node(s) had untolerated taint {node.kubernetes.io/unreachable: }."
    )
    text = explain_unschedulable(message, H200, ("nvidia.com/gpu",))
    assert text.startswith("Waiting for a free H200: all of them are in use (1 node with H200 is")
    assert "also short of CPU on 1 node" in text


def test_cpu_only_server_waiting_for_room():
    message = "0/2 nodes are available: 2 Insufficient memory."
    assert explain_unschedulable(message, None).startswith(
        "Waiting for room in the cluster: not enough free memory on 2 nodes"
    )


def test_other_events_are_left_alone():
    assert explain_unschedulable("Successfully assigned ns/pod to node-1", H200) is None


NO_QUOTA = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu "
    "in flavor jupyterhub-gpu, 1 more needed"
)


def workload(
    name: str,
    created: str,
    *,
    queue: str = "lab",
    namespace: str = "hub",
    priority: int | None = None,
    reserved: bool = False,
    owner: str = "",
) -> dict:
    status = "True" if reserved else "False"
    message = "Quota reserved in ClusterQueue lab" if reserved else NO_QUOTA
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": created,
            "ownerReferences": [{"kind": "Pod", "uid": owner or f"uid-{name}"}],
        },
        "spec": {"queueName": queue, **({"priority": priority} if priority is not None else {})},
        "status": {"conditions": [{"type": "QuotaReserved", "status": status, "message": message}]},
    }


def test_kueue_position_is_fifo_by_priority_within_the_local_queue():
    running = workload("ann", "2026-01-01T10:00:00Z", reserved=True)
    bob = workload("bob", "2026-01-01T10:01:00Z")
    cy = workload("cy", "2026-01-01T10:02:00Z")
    urgent = workload("urgent", "2026-01-01T10:03:00Z", priority=100)
    elsewhere = workload("other", "2026-01-01T09:00:00Z", queue="physics")
    other_namespace = workload("far", "2026-01-01T09:00:00Z", namespace="other")
    every = [running, bob, cy, urgent, elsewhere, other_namespace]
    # the running one holds quota: not in line; a higher priority goes first
    assert kueue_position(urgent, every) == 1
    assert kueue_position(bob, every) == 2
    assert kueue_position(cy, every) == 3
    assert kueue_position(running, every) is None
    assert kueue_position(bob, [running, bob, cy]) == 1


def test_kueue_queue_line_has_the_position_and_kueues_reason():
    queued = workload("bob", "2026-01-01T10:01:00Z")
    assert kueue_queue_line("lab", queued, 1) == (
        f"Waiting in Kueue queue lab: position 1. Kueue: {NO_QUOTA}. "
        "The server starts by itself when Kueue admits it; stop it to give up."
    )
    assert kueue_queue_line("lab", None, None).startswith(
        "Waiting in Kueue queue lab: Kueue has not taken the server into its queue yet."
    )


def test_a_pods_workload_and_gate_are_found():
    pod = {"metadata": {"uid": "uid-bob"}, "spec": {"schedulingGates": []}}
    bob = workload("bob", "2026-01-01T10:01:00Z")
    assert workload_of(pod, [workload("ann", "2026-01-01T10:00:00Z"), bob]) is bob
    assert not gated_by_kueue(pod)
    pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    assert gated_by_kueue(pod)


def podgroup(name: str, created: str, phase: str = "Pending", **spec) -> dict:
    """A PodGroup as Volcano's controller writes it for a bare pod (API form)."""
    return {
        "metadata": {"name": f"podgroup-{name}", "namespace": "hub", "creationTimestamp": created},
        "spec": {"queue": "lab", "minMember": 1, **spec},
        "status": {
            "phase": phase,
            "conditions": [
                {
                    "type": "Unschedulable",
                    "status": "True",
                    "reason": "NotEnoughResources",
                    "message": "1/1 tasks in gang unschedulable: pod group is not ready",
                }
            ],
        },
    }


PRIORITIES = {"jupyterhub-gpu-in-quota": 1000, "jupyterhub-gpu-over-quota": 100}


def test_volcano_position_counts_pending_podgroups_of_the_queue_by_priority_then_age():
    running = podgroup("ann", "2026-01-01T10:00:00Z", phase="Running")
    admitted = podgroup("bob", "2026-01-01T10:00:30Z", phase="Inqueue")
    cy = podgroup("cy", "2026-01-01T10:01:00Z", priorityClassName="jupyterhub-gpu-over-quota")
    dee = podgroup("dee", "2026-01-01T10:02:00Z", priorityClassName="jupyterhub-gpu-over-quota")
    urgent = podgroup("eve", "2026-01-01T10:03:00Z", priorityClassName="jupyterhub-gpu-in-quota")
    elsewhere = podgroup("far", "2026-01-01T09:00:00Z", queue="physics")
    every = [running, admitted, cy, dee, urgent, elsewhere]
    # in line: only Pending ones of the same queue; a higher priority class goes first
    assert volcano_position(urgent, every, PRIORITIES) == 1
    assert volcano_position(cy, every, PRIORITIES) == 2
    assert volcano_position(dee, every, PRIORITIES) == 3
    assert volcano_position(admitted, every, PRIORITIES) is None
    assert volcano_position(running, every, PRIORITIES) is None


def test_volcano_queue_line_and_a_pods_podgroup():
    cy = podgroup("cy", "2026-01-01T10:01:00Z")
    assert volcano_queue_line("lab", cy, 2) == (
        "Waiting in Volcano queue lab: position 2. Volcano: the queue has no room for it "
        "yet (PodGroup Pending, NotEnoughResources). The server starts by itself when "
        "Volcano lets it in; stop it to give up."
    )
    assert volcano_queue_line("lab", cy, 2, "Closed") == (
        "Waiting in Volcano queue lab: position 2. Volcano: the queue is Closed: it lets "
        "nothing in until an admin opens it. The server starts by itself when Volcano "
        "lets it in; stop it to give up."
    )
    pod = {"metadata": {"namespace": "hub", "annotations": {}}}
    assert podgroup_of(pod, [cy]) is None  # not yet grouped by Volcano's controller
    pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = "podgroup-cy"
    assert podgroup_of(pod, [podgroup("ann", "2026-01-01T10:00:00Z"), cy]) is cy
    pod["metadata"]["namespace"] = "elsewhere"
    assert podgroup_of(pod, [cy]) is None
