"""Interfaces and datasets in a real hub, spawning into the local cluster, with the
homes z2jh's ``singleuser.storage`` gives (both of its kinds).

What is asserted is the pod Kubernetes was given and what the server opens: a
research server mounts research's datasets and not the students', read-only
where the policy says, beside the chart's home; the interface chosen is the
server's default URL; options a user forges change nothing and start nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from hub_helpers import api, pod_json, ready
from kube_helpers import create_bound_claim, eventually, remove_claims, volume_body

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

POLICY = {
    "flavors": {"h200": {"kind": "gpu"}},
    "profiles": {
        "small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}},
        "cpu": {"cpu": "100m", "memory": "128Mi"},
    },
    "everyone": {"profiles": ["cpu"]},
    "interfaces": {
        "lab": {"display_name": "JupyterLab", "url": "/lab"},
        "vscode": {"display_name": "VS Code", "url": "/vscode/"},
    },
    "datasets": {
        # nothing in the local cluster mounts it (its pods are processes): the address
        # is the loopback one all the same
        "imagenet": {
            "nfs": {"server": "127.0.0.1", "path": "/export/imagenet"},
            "mount_path": "/data/imagenet",
            "read_only": True,
        },
        "training": {"claim": "research-training", "mount_path": "/data/training"},
        "course": {"claim": "course-data", "mount_path": "/data/course", "read_only": True},
    },
    "groups": {
        "research": {
            "quota": {"gpus": 4},
            "profiles": ["small"],
            "interfaces": ["lab", "vscode"],
            "datasets": ["imagenet", "training"],
        },
        "students": {"quota": {"gpus": 2}, "profiles": ["small"], "datasets": ["course"]},
    },
}

#: what z2jh 4.x's jupyterhub_config.py sets on KubeSpawner for each
#: ``singleuser.storage.type`` (homeMountPath /home/jovyan, the chart's defaults)
Z2JH_STORAGE = {
    "dynamic": (
        "c.KubeSpawner.pvc_name_template = 'claim-{username}{servername}'\n"
        "c.KubeSpawner.storage_pvc_ensure = True\n"
        "c.KubeSpawner.storage_capacity = '10Gi'\n"
        "c.KubeSpawner.storage_access_modes = ['ReadWriteOnce']\n"
        "c.KubeSpawner.volumes = [{'name': 'volume-{username}{servername}',"
        " 'persistentVolumeClaim': {'claimName': '{pvc_name}'}}]\n"
        "c.KubeSpawner.volume_mounts = [{'mountPath': '/home/jovyan',"
        " 'name': 'volume-{username}{servername}'}]\n"
    ),
    "static": (
        "c.KubeSpawner.volumes = [{'name': 'home', 'persistentVolumeClaim':"
        " {'claimName': 'home-nfs'}}]\n"
        "c.KubeSpawner.volume_mounts = [{'mountPath': '/home/jovyan', 'name': 'home',"
        " 'subPath': '{username}'}]\n"
    ),
}


async def volume_for_home(core, namespace: str, claim: str) -> None:
    """A volume made for a home claim KubeSpawner is about to make (as z2jh's dynamic
    storage gets one from its provisioner): the cluster's volume binder binds them,
    and kube-scheduler places no pod whose claim is unbound."""
    volume = f"{namespace}-{claim}"
    await core.create_persistent_volume(
        volume_body(volume, namespace, claim, "10Gi", "ReadWriteOnce", reclaim_policy="Retain")
    )


@pytest.fixture
async def claims_removed(core):
    """The namespaces whose claims and volumes go after the test, once its hub is gone
    (requested first, so torn down last): volumes are cluster-wide, and a claim's
    protection finalizer would keep its namespace for ever."""
    namespaces: list[str] = []
    yield namespaces
    for namespace in namespaces:
        await remove_claims(core, namespace)


def volumes_and_mounts(pod: dict) -> tuple[dict, dict]:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "notebook")
    return (
        {v["name"]: v for v in pod["spec"]["volumes"]},
        {m["mountPath"]: m for m in container["volumeMounts"]},
    )


@pytest.mark.parametrize("storage", ["dynamic", "static"])
async def test_a_research_server_opens_its_interface_and_mounts_its_datasets_beside_the_home(
    claims_removed, hub_factory, core, storage
):
    hub = await hub_factory(
        users={"ann": ["research"], "bo": ["students"]},
        policy=POLICY,
        extra_config=Z2JH_STORAGE[storage],
    )
    claims_removed.append(hub.namespace)
    home = "claim-ann" if storage == "dynamic" else "home-nfs"
    if storage == "dynamic":
        for claim in ("claim-ann", "claim-bo"):
            await volume_for_home(core, hub.namespace, claim)
    else:
        await create_bound_claim(core, hub.namespace, home)
    for claim in ("research-training", "course-data"):
        await create_bound_claim(core, hub.namespace, claim)

    status, body = await api(
        hub, "POST", "/users/ann/server", {"profile": "research--small", "interface": "vscode"}
    )
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "ann"), "ann's server to be ready", within=120)
    pod = await pod_json(core, hub.namespace, "jupyter-ann")
    volumes, mounts = volumes_and_mounts(pod)

    # the chart's home, unchanged, and research's datasets beside it; not the students'
    home_volume = "volume-ann" if storage == "dynamic" else "home"
    assert volumes[home_volume]["persistentVolumeClaim"]["claimName"] == home
    assert mounts["/home/jovyan"]["name"] == home_volume
    if storage == "static":
        assert mounts["/home/jovyan"]["subPath"] == "ann"
    assert sorted(volumes) == sorted([home_volume, "dataset-imagenet", "dataset-training"])
    assert volumes["dataset-imagenet"]["nfs"] == {
        "server": "127.0.0.1",
        "path": "/export/imagenet",
        "readOnly": True,
    }
    # (Kubernetes leaves out a readOnly that is false)
    assert volumes["dataset-training"]["persistentVolumeClaim"]["claimName"] == "research-training"
    assert volumes["dataset-training"]["persistentVolumeClaim"].get("readOnly", False) is False
    assert mounts["/data/imagenet"]["readOnly"] is True
    assert mounts["/data/training"].get("readOnly") in (False, None)
    assert "/data/course" not in mounts

    # the chosen interface is where the server opens
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["JUPYTERHUB_DEFAULT_URL"] == "/vscode/"
    _, model = await api(hub, "GET", "/users/ann")
    assert model["servers"][""]["user_options"]["interface"] == "vscode"

    # a student's server: the course data, read-only, and JupyterLab (their only one)
    status, body = await api(hub, "POST", "/users/bo/server", {"profile": "students--small"})
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "bo"), "bo's server to be ready", within=120)
    volumes, mounts = volumes_and_mounts(await pod_json(core, hub.namespace, "jupyter-bo"))
    assert [n for n in volumes if n.startswith("dataset-")] == ["dataset-course"]
    assert volumes["dataset-course"]["persistentVolumeClaim"]["readOnly"] is True
    assert mounts["/data/course"]["readOnly"] is True
    bo_pod = await pod_json(core, hub.namespace, "jupyter-bo")
    env = {e["name"]: e.get("value") for e in bo_pod["spec"]["containers"][0]["env"]}
    assert env["JUPYTERHUB_DEFAULT_URL"] == "/lab"


#: forged REST spawns: (user, options, what the refusal says)
FORGED = [
    (
        "bo",
        {"profile": "students--small", "interface": "vscode"},
        "interface 'vscode' is not offered with students--small (offered: lab)",
    ),
    (
        "ann",
        {"profile": "research--small", "volumes": [{"name": "x", "hostPath": {"path": "/"}}]},
        "unknown option 'volumes': only the form's choices are accepted",
    ),
    (
        "ann",
        {"profile": "research--small", "volume_mounts": {"x": {"mountPath": "/data"}}},
        "unknown option 'volume_mounts'",
    ),
    (
        "ann",
        {"profile": "research--small", "interface": {"url": "/terminals/1"}},
        "interface: expected one of the form's choices, got an object",
    ),
    ("ann", {"profile": "students--small"}, "profile 'students--small' is not offered"),
]


async def test_forged_options_are_refused_and_start_nothing(hub_factory, core):
    hub = await hub_factory(users={"ann": ["research"], "bo": ["students"]}, policy=POLICY)
    for user, options, message in FORGED:
        status, body = await api(hub, "POST", f"/users/{user}/server", options)
        assert status in (400, 403), (options, body)
        assert message in body["message"], options
    await asyncio.sleep(1)
    assert (await core.list_namespaced_pod(hub.namespace)).items == []
    for user in ("ann", "bo"):
        _, model = await api(hub, "GET", f"/users/{user}")
        assert model["servers"] == {}
