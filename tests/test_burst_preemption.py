"""With fair share, the scheduler takes the heaviest users' bursts first.

A node with 2 GPUs holds two servers bursting above group ``lab``'s quota (it has
none): ``heavy`` used lab's GPUs all day, ``light`` never did. When ``boss`` starts
a server within ``prio``'s quota there, kube-scheduler preempts one of them: the
heavy user's, though it started first (of two pods of one priority it would take
the one started last).
"""

from __future__ import annotations

import uuid

import pytest
from test_fair_share_hub import used
from test_gpu_time import running, store_for

from hub_helpers import api
from kube_helpers import dedicated_gpu_node, eventually, taken_away, user_pod

pytestmark = [pytest.mark.k8s, pytest.mark.hub]


async def test_the_heaviest_users_burst_is_preempted_first(hub_factory, core, tmp_path):
    pool = f"burst-{uuid.uuid4().hex[:6]}"
    node = await dedicated_gpu_node(core, pool, gpus=2)
    store, config = store_for(tmp_path)
    used(store, "heavy", "lab", gpu_hours=12)
    policy = {
        "fair_share": {"half_life": "1d"},
        "flavors": {"a100": {"kind": "gpu", "node_selector": {"jupyterhub-gpu.local/pool": pool}}},
        "profiles": {"gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "a100"}}},
        "groups": {
            "lab": {"quota": {"gpus": 0}, "limit": {"gpus": 2}, "profiles": ["gpu"]},
            "prio": {"quota": {"gpus": 1}, "profiles": ["gpu"]},
        },
    }
    try:
        hub = await hub_factory(
            users={"heavy": ["lab"], "light": ["lab"], "boss": ["prio"]},
            policy=policy,
            extra_config=config,
        )
        for user in ("heavy", "light"):  # heavy's first: it started earlier
            status, body = await api(hub, "POST", f"/users/{user}/server", {"profile": "lab--gpu"})
            assert status in (201, 202), body
            await running(hub, user)
        heavys = await user_pod(core, hub.namespace, "heavy")
        lights = await user_pod(core, hub.namespace, "light")
        # both burst; the heavy user's class is the lowest
        assert heavys.metadata.labels["gpu.jupyterhub.org/tier"] == "over-quota"
        # heavy used all of lab's GPU time and lab all its siblings' (over twice its
        # share): the over-quota class itself; light, who used none, the band above
        assert (heavys.spec.priority_class_name, heavys.spec.priority) == (
            "jupyterhub-gpu-over-quota",
            100,
        )
        assert (lights.spec.priority_class_name, lights.spec.priority) == (
            "jupyterhub-gpu-over-quota-light",
            120,
        )
        assert heavys.spec.node_name == lights.spec.node_name == node

        status, body = await api(hub, "POST", "/users/boss/server", {"profile": "prio--gpu"})
        assert status in (201, 202), body

        await eventually(
            lambda: taken_away(core, heavys), "kube-scheduler to preempt heavy's burst", within=60
        )
        await running(hub, "boss")
        kept = await core.read_namespaced_pod(lights.metadata.name, hub.namespace)
        assert (kept.metadata.uid, kept.metadata.deletion_timestamp) == (lights.metadata.uid, None)
    finally:
        await core.delete_node(node)
