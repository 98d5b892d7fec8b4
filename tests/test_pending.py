"""Plain-language reasons for a Pending server (pure; with a real scheduler: test_hub_failures)."""

from __future__ import annotations

from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.pending import explain_unschedulable

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
