"""GPUKubeSpawner is a drop-in for KubeSpawner: every KubeSpawner setting keeps working.

One fixture, parametrised over the spawners (stock ``KubeSpawner``, and
``GPUKubeSpawner`` with a policy in force and a CPU or a GPU profile chosen), renders
the pod each would create from the same KubeSpawner settings, with the spawn's
options loaded as ``start`` does and ``modify_pod_hook`` applied as ``start`` does.
Every test asserts what the setting does in the pod, for each spawner; for the GPU
spawner the fixture also asserts that its pod is exactly KubeSpawner's pod, rendered
with the same settings plus what the policy adds (resources, the GPU toleration after
the site's, the priority class, labels and annotations), and nothing else.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio.client import V1OwnerReference
from kubespawner import KubeSpawner
from traitlets.config import Config

from jupyterhub_gpu.core.shaping import kubespawner_items
from jupyterhub_gpu.hub.offline import _Named, _unreachable_cluster, offline_spawner

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
POLICY = {
    "flavors": {"a100": {"kind": "gpu", "node_selector": {"gpu-type": "a100"}}},
    "profiles": {
        "cpu": {"cpu": 2, "memory": "2Gi"},
        "gpu": {"cpu": 4, "memory": "8Gi", "gpu": {"flavor": "a100"}},
    },
    "groups": {"lab": {"quota": {"gpus": 4}, "profiles": ["cpu", "gpu"]}},
}
#: what the policy's profiles set, written as the KubeSpawner settings they amount to
POLICY_SETTINGS = {
    "cpu": {
        "cpu_guarantee": 2.0,
        "cpu_limit": 2.0,
        "mem_guarantee": 2 * 2**30,
        "mem_limit": 2 * 2**30,
        "priority_class_name": "jupyterhub-gpu-in-quota",
    },
    "gpu": {
        "cpu_guarantee": 4.0,
        "cpu_limit": 4.0,
        "mem_guarantee": 8 * 2**30,
        "mem_limit": 8 * 2**30,
        "priority_class_name": "jupyterhub-gpu-in-quota",
        "extra_resource_guarantees": {"nvidia.com/gpu": "1"},
        "extra_resource_limits": {"nvidia.com/gpu": "1"},
        "node_selector": {"gpu-type": "a100"},
        "tolerations": [GPU_TOLERATION],
    },
}


def _user() -> _Named:
    return _Named(name="ann", id=1, url="/user/ann/", groups=[_Named(name="lab")])


def _with_policy_settings(site: dict[str, Any], profile: str) -> dict[str, Any]:
    """The site's KubeSpawner settings with the policy's added the way the docs say:
    amounts and the priority class replaced, maps merged (the policy's keys win),
    tolerations appended after the site's own (in KubeSpawner's order)."""
    merged = dict(site)
    for key, value in POLICY_SETTINGS[profile].items():
        if key == "tolerations":
            merged[key] = kubespawner_items(site.get(key)) + value
        elif isinstance(value, dict):
            merged[key] = {**site.get(key, {}), **value}
        else:
            merged[key] = value
    return merged


@dataclass
class Rendered:
    spawner: KubeSpawner
    pod: dict[str, Any]
    #: what modify_pod_hook received, if there is a hook
    hooked: Any = None


async def _render(spawner_class: str, settings: dict[str, Any], profile: str | None) -> Rendered:
    """The pod ``spawner_class`` would create with these KubeSpawner settings."""
    config = Config()
    config.KubeSpawner.update(copy.deepcopy(settings))
    if spawner_class == "GPUKubeSpawner":
        config.GPUPolicy.update(copy.deepcopy(POLICY))
        spawner = offline_spawner(config, "ann", ["lab"])
        spawner.user_options = {"profile": f"lab--{profile}"}
    else:
        with _unreachable_cluster():
            spawner = KubeSpawner(_mock=True, config=config, user=_user())
        spawner.user_options = (
            {"profile": settings["profile_list"][0]["slug"]}
            if (settings.get("profile_list"))
            else {}
        )
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    hooked = None
    if spawner.modify_pod_hook:  # as KubeSpawner's start applies it, to what it made
        hooked = pod
        pod = await spawner.modify_pod_hook(spawner, pod)
    return Rendered(spawner, spawner.api.api_client.sanitize_for_serialization(pod), hooked)


@pytest.fixture(params=["KubeSpawner", "GPUKubeSpawner-cpu", "GPUKubeSpawner-gpu"])
def render(request):
    """``render(settings)``: the pod of this spawner; for GPUKubeSpawner, asserted to be
    KubeSpawner's pod from the same settings plus exactly the policy's shape."""
    spawner_class, _, profile = request.param.partition("-")

    async def rendered(settings: dict[str, Any]) -> Rendered:
        mine = await _render(spawner_class, settings, profile or None)
        if spawner_class == "GPUKubeSpawner":
            stock_settings = _with_policy_settings(settings, profile)
            if "kubespawner_override" in POLICY["profiles"][profile]:
                stock_settings["profile_list"] = [
                    {
                        "slug": "p",
                        "display_name": "p",
                        "kubespawner_override": POLICY["profiles"][profile]["kubespawner_override"],
                    }
                ]
            stock = await _render("KubeSpawner", stock_settings, None)
            expected = stock.pod
            shape = mine.spawner.gpu_shape
            expected["metadata"]["labels"].update(shape.labels)
            expected["metadata"]["annotations"].update(shape.annotations)
            # and the end of a failed server's log kept in its status, unless the site
            # chose where its termination message comes from
            for container in expected["spec"]["containers"]:
                if container["name"] == "notebook":
                    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
            assert mine.pod == expected
        return mine

    rendered.profile = profile
    return rendered


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]


async def test_pod_name_template_and_labels(render):
    r = await render(
        {
            "pod_name_template": "nb-{username}{servername}",
            "extra_labels": {"team": "{username}-team"},
            "extra_annotations": {"owner": "{username}"},
        }
    )
    assert r.pod["metadata"]["name"] == "nb-ann"
    assert r.pod["metadata"]["labels"]["team"] == "ann-team"
    assert r.pod["metadata"]["annotations"]["owner"] == "ann"


async def test_environment_with_templates(render):
    r = await render({"environment": {"GREETING": "hello {username}", "PLAIN": "1"}})
    env = {e["name"]: e.get("value") for e in _container(r.pod)["env"]}
    assert env["GREETING"] == "hello ann"
    assert env["PLAIN"] == "1"


@pytest.mark.parametrize("form", ["list", "dict"])
async def test_volumes_and_mounts_in_both_forms(render, form):
    volumes = [
        {"name": "home", "persistentVolumeClaim": {"claimName": "claim-{username}"}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts = [
        {"name": "home", "mountPath": "/home/jovyan"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    if form == "dict":  # values files merge these: the values, sorted by key
        volumes = {"10-home": volumes[0], "20-shm": volumes[1]}
        mounts = {"10-home": mounts[0], "20-shm": mounts[1]}
    r = await render({"volumes": volumes, "volume_mounts": mounts})
    assert r.pod["spec"]["volumes"] == [
        {"name": "home", "persistentVolumeClaim": {"claimName": "claim-ann"}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    assert [m["mountPath"] for m in _container(r.pod)["volumeMounts"]] == [
        "/home/jovyan",
        "/dev/shm",
    ]


@pytest.mark.parametrize("form", ["list", "dict"])
async def test_tolerations_in_both_forms_come_first_and_unchanged(render, form):
    site = [
        {"key": "dedicated", "operator": "Equal", "value": "jupyter", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
    ]
    tolerations = {"b-spot": site[1], "a-dedicated": site[0]} if form == "dict" else site
    r = await render({"tolerations": tolerations})
    got = r.pod["spec"]["tolerations"]
    assert got[:2] == site
    if render.profile == "gpu":
        assert got[2:] == [GPU_TOLERATION]
    else:
        assert got[2:] == []


@pytest.mark.parametrize("form", ["list", "dict"])
async def test_affinity_in_both_forms(render, form):
    required = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
    preferred = {
        "weight": 10,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": {"component": "singleuser-server"}},
            "topologyKey": "kubernetes.io/hostname",
        },
    }

    def shaped(item):
        return {"x": item} if form == "dict" else [item]

    r = await render(
        {
            "node_affinity_required": shaped(required),
            "pod_affinity_preferred": shaped(preferred),
            "pod_anti_affinity_preferred": shaped(preferred),
        }
    )
    affinity = r.pod["spec"]["affinity"]
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [required]
    }
    assert affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [preferred]
    assert affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [
        preferred
    ]


@pytest.mark.parametrize("form", ["list", "dict"])
async def test_init_and_extra_containers_in_both_forms(render, form):
    init = {"name": "fetch", "image": "busybox", "command": ["true"]}
    sidecar = {"name": "logger", "image": "busybox", "command": ["sleep", "inf"]}
    if form == "dict":
        settings = {"init_containers": {"a": init}, "extra_containers": {"a": sidecar}}
    else:
        settings = {"init_containers": [init], "extra_containers": [sidecar]}
    r = await render(settings)
    assert r.pod["spec"]["initContainers"] == [init]
    assert [c["name"] for c in r.pod["spec"]["containers"]] == ["notebook", "logger"]
    # the policy's resources are the notebook container's alone
    assert "resources" not in r.pod["spec"]["containers"][1]


async def test_image_pull_secrets_lifecycle_hooks_and_security_contexts(render):
    r = await render(
        {
            "image_pull_secrets": ["registry-creds"],
            "lifecycle_hooks": {"postStart": {"exec": {"command": ["sh", "-c", "echo hi"]}}},
            "uid": 1000,
            "gid": 100,
            "fs_gid": 100,
            "supplemental_gids": [4242],
            "container_security_context": {"allowPrivilegeEscalation": False},
            "pod_security_context": {"seccompProfile": {"type": "RuntimeDefault"}},
        }
    )
    spec, container = r.pod["spec"], _container(r.pod)
    assert spec["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert container["lifecycle"]["postStart"]["exec"]["command"] == ["sh", "-c", "echo hi"]
    assert container["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["securityContext"]["fsGroup"] == 100
    assert spec["securityContext"]["supplementalGroups"] == [4242]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


async def test_storage_and_service_manifests_are_kubespawners(render):
    settings = {
        "storage_pvc_ensure": True,
        "pvc_name_template": "home-{username}",
        "storage_capacity": "10Gi",
        "storage_class": "fast",
        "services_enabled": True,
    }
    r = await render(settings)
    stock = await _render("KubeSpawner", settings, None)
    sanitize = r.spawner.api.api_client.sanitize_for_serialization
    pvc = sanitize(r.spawner.get_pvc_manifest())
    assert pvc["metadata"]["name"] == "home-ann"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert pvc == sanitize(stock.spawner.get_pvc_manifest())
    owner = V1OwnerReference(api_version="v1", kind="Pod", name="x", uid="u")
    # KubeSpawner 7.1 also takes the port; 7.0 (z2jh 4.x's hub images) does not
    takes_port = "port" in inspect.signature(KubeSpawner.get_service_manifest).parameters
    port = (8888,) if takes_port else ()
    service = sanitize(r.spawner.get_service_manifest(owner, *port))
    assert service == sanitize(stock.spawner.get_service_manifest(owner, *port))


async def test_modify_pod_hook_gets_kubespawners_pod_and_its_changes_survive(render):
    seen = {}

    async def hook(spawner, pod):
        # hooks written for KubeSpawner index the admin's own dicts inside its models
        seen["claim"] = pod.spec.volumes[0].persistent_volume_claim["claimName"]
        pod.metadata.labels["hooked"] = "yes"
        pod.spec.containers[0].env.append({"name": "FROM_HOOK", "value": "1"})
        return pod

    r = await render(
        {
            "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "c-{username}"}}],
            "modify_pod_hook": hook,
        }
    )
    assert seen == {"claim": "c-ann"}
    assert r.pod["metadata"]["labels"]["hooked"] == "yes"
    assert {"name": "FROM_HOOK", "value": "1"} in _container(r.pod)["env"]


async def test_a_field_newer_than_the_client_is_sent_as_written(render):
    # a key the installed client's models do not know (or a typo the API server would
    # name): KubeSpawner sends it, so the API server can take or refuse it
    r = await render(
        {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "d", "futureKey": True}}
            ],
            "extra_pod_config": {"dnsConfig": {"options": [{"name": "ndots", "value": "2"}]}},
            "extra_container_config": {"securityContext": {"futureField": "x"}},
        }
    )
    assert r.pod["spec"]["volumes"][0]["persistentVolumeClaim"]["futureKey"] is True
    assert r.pod["spec"]["dnsConfig"] == {"options": [{"name": "ndots", "value": "2"}]}
    assert _container(r.pod)["securityContext"] == {"futureField": "x"}


async def test_a_policy_profiles_kubespawner_override_applies(monkeypatch, render):
    override = {"environment": {"FROM_PROFILE": "{username}"}, "image_pull_policy": "Always"}
    for profile in POLICY["profiles"].values():
        monkeypatch.setitem(profile, "kubespawner_override", override)
    r = await render({"environment": {"SITE": "1"}})
    env = {e["name"]: e.get("value") for e in _container(r.pod)["env"]}
    assert env["SITE"] == "1"
    if render.profile:
        # the chosen policy profile's override, applied as KubeSpawner applies a
        # profile's (a mapping merged into the site's)
        assert env["FROM_PROFILE"] == "ann"
        assert _container(r.pod)["imagePullPolicy"] == "Always"
    else:  # stock KubeSpawner here has no profile list: the site's settings alone
        assert "FROM_PROFILE" not in env


async def test_a_sites_own_termination_message_policy_is_kept(render):
    r = await render({"extra_container_config": {"terminationMessagePolicy": "File"}})
    assert _container(r.pod)["terminationMessagePolicy"] == "File"
