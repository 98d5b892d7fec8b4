"""Each local cluster's pod range: clusters side by side never share a pod IP.

Two clusters handing out the same loopback pod IP means one hub reaches the
other cluster's notebook server (seen with the demo next to a test session).
"""

from __future__ import annotations

import ipaddress
import random
import re

import pytest

from jupyterhub_gpu_dev.localcluster.cluster import (
    POD_PREFIX,
    POD_RANGE,
    ClusterError,
    choose_pod_cidr,
    pod_addresses_in_use,
    state_root,
)

BLOCKS = list(POD_RANGE.subnets(new_prefix=POD_PREFIX))


def block_of(cidr: str) -> ipaddress.IPv4Network:
    return ipaddress.ip_network(cidr, strict=False)


def test_a_free_block_as_kwok_takes_it():
    cidr = choose_pod_cidr(set(), random.Random(1))
    gateway, prefix = cidr.split("/")
    assert int(prefix) == POD_PREFIX
    assert block_of(cidr) in BLOCKS
    assert ipaddress.ip_address(gateway) == block_of(cidr).network_address + 1


def test_blocks_holding_a_listening_pod_ip_are_never_chosen():
    # a pod of another cluster listens in every block but one
    free = BLOCKS[17]
    in_use = {str(b.network_address + 5) for b in BLOCKS if b != free}
    for seed in range(20):
        assert block_of(choose_pod_cidr(in_use, random.Random(seed))) == free


def test_an_older_clusters_whole_16_is_avoided():
    old = "127.64.0.1/16"
    chosen = {block_of(choose_pod_cidr({old}, random.Random(s))) for s in range(200)}
    assert not any(b.overlaps(block_of(old)) for b in chosen)
    assert len(chosen) > 1  # random among the free blocks, not always the first


def test_no_free_block_is_a_clear_error():
    with pytest.raises(ClusterError, match=re.escape("every /18 of 127.64.0.0/10 is in use")):
        choose_pod_cidr({"127.64.0.0/10"})


@pytest.mark.k8s
def test_a_running_clusters_range_is_taken_wherever_its_folder_is(local_cluster):
    # a test session's cluster (here: this worker's) keeps its state in pytest's temporary
    # folder, and has no pod listening yet when another session's cluster starts beside it
    assert not local_cluster.state.path.is_relative_to(state_root())
    assert local_cluster.state.pod_cidr in pod_addresses_in_use()


@pytest.mark.k8s
def test_a_port_another_process_took_meanwhile_is_chosen_again(tmp_path, monkeypatch):
    """Ports are chosen free and bound a moment later; a cluster starting beside this
    one may take one in between. The component exits on it, and the start tries again
    with new ports instead of failing (or waiting a minute for nodes that never come)."""
    import socket

    from jupyterhub_gpu_dev.localcluster import cluster as cluster_module

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    chosen = cluster_module.free_port
    handed_out = iter([port])  # the first port handed out (etcd's) is in use
    monkeypatch.setattr(cluster_module, "free_port", lambda: next(handed_out, None) or chosen())
    said: list[str] = []
    try:
        started = cluster_module.LocalCluster.create(
            name="port-taken", directory=tmp_path / "cluster", progress=said.append
        )
        try:
            assert port not in started.state.ports.values()
            (again,) = [m for m in said if "a port was taken" in m]
            assert "etcd exited during start-up" in again
            assert cluster_module.PORT_TAKEN in again
        finally:
            started.down()
    finally:
        taken.close()
