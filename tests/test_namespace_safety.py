"""The GPU service writes only into namespaces that are its own.

A group whose namespace would be one of Kubernetes' own or the hub's is refused by
``jupyterhub-gpu check``, ``manifests``, the hub's and the service's start-up; an
existing namespace without the service's ownership labels is left untouched and
reported by the reconciler (against the real API server) unless the policy's
``adopt_namespaces`` lists it.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio.client.exceptions import ApiException
from traitlets.config import Config

from jupyterhub_gpu.cli import main
from jupyterhub_gpu.config.hubconfig import check_policy
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.objects import HUB_LABEL, OWNER, OWNER_LABEL

ROOT = Path(__file__).resolve().parents[1]
P = "hub.config.GPUPolicy"
CPU = {"cpu": {"cpu": "100m", "memory": "128Mi"}}


def values_file(tmp_path: Path, policy: dict, **hub_config) -> str:
    path = tmp_path / "values.yaml"
    # the spawner that enforces the policy (check says so of any other)
    config = {"JupyterHub": {"spawner_class": "gpu-kubespawner"}, "GPUPolicy": policy}
    path.write_text(yaml.safe_dump({"hub": {"config": {**config, **hub_config}}}))
    return str(path)


def typo_policy(group: str) -> dict:
    """A policy whose empty prefix makes a group's name its namespace."""
    return {
        "namespace_per_group": True,
        "namespace_prefix": "",
        "profiles": CPU,
        "groups": {group: {"profiles": ["cpu"]}, "lab": {"profiles": ["cpu"]}},
    }


@pytest.mark.parametrize("command", ["check", "manifests"])
def test_check_and_manifests_refuse_a_system_namespace_with_the_key_path_and_fix(
    tmp_path, capsys, command
):
    values = values_file(tmp_path, typo_policy("kube-system"))
    assert main([command, str(ROOT / "helm-values" / "base.yaml"), values]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # not one manifest printed
    assert (
        f"{P}.groups.kube-system: with namespace_per_group its namespace would be "
        "'kube-system', one of Kubernetes' own"
    ) in err
    assert "set namespace_prefix (e.g. 'jh-') or rename the group" in err


def test_manifests_refuse_a_group_namespace_that_is_the_hubs(tmp_path, capsys):
    values = values_file(tmp_path, typo_policy("jupyterhub"))
    assert main(["manifests", values, "--hub-namespace", "jupyterhub"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        f"{P}.groups.jupyterhub: with namespace_per_group its namespace 'jupyterhub' is the "
        "hub's own, where the hub, the proxy and servers from before the policy run: set "
        "namespace_prefix (e.g. 'jh-') or rename the group"
    ) in err
    assert main(["manifests", values, "--hub-namespace", "jhub"]) == 0
    assert "name: jupyterhub\n" in capsys.readouterr().out


def test_check_refuses_the_hubs_namespace_from_the_option_or_the_spawners_setting(tmp_path, capsys):
    values = values_file(tmp_path, typo_policy("jhub"))
    assert main(["check", values]) == 0  # where the hub runs is not known: nothing to say
    capsys.readouterr()
    assert main(["check", values, "--hub-namespace", "jhub"]) == 1
    assert f"{P}.groups.jhub: with namespace_per_group its namespace 'jhub' is the hub's own" in (
        capsys.readouterr().err
    )
    spawner_says = values_file(tmp_path, typo_policy("jhub"), KubeSpawner={"namespace": "jhub"})
    assert main(["check", spawner_says]) == 1
    assert "'jhub' is the hub's own" in capsys.readouterr().err


def test_the_hub_does_not_start_with_a_group_in_its_own_namespace(monkeypatch):
    config = Config()
    config.JupyterHub.spawner_class = "gpu-kubespawner"
    config.GPUPolicy.update(typo_policy("jhub"))
    report = io.StringIO()
    # z2jh's hub pod says where it runs in POD_NAMESPACE
    monkeypatch.setenv("POD_NAMESPACE", "jhub")
    with pytest.raises(SystemExit) as exited:
        check_policy(config, stream=report)
    assert exited.value.code == 1
    assert "the hub will not start" in report.getvalue()
    assert f"{P}.groups.jhub: with namespace_per_group its namespace 'jhub' is the hub's own" in (
        report.getvalue()
    )
    monkeypatch.setenv("POD_NAMESPACE", "elsewhere")
    check_policy(config, stream=io.StringIO())  # starts
    config.KubeSpawner.namespace = "jhub"  # the spawner's own setting wins
    with pytest.raises(SystemExit):
        check_policy(config, stream=io.StringIO())


def test_the_service_does_not_start_with_a_group_in_the_hubs_namespace(tmp_path):
    from test_service_views import service_from_config

    # the hub config there spawns into namespace jhub
    with pytest.raises(SystemExit, match=rf"{P}\.groups\.jhub: with namespace_per_group its "):
        service_from_config(tmp_path, typo_policy("jhub"))


# ---- the reconciler against the real API server --------------------------------------


def policy_for(hub: str, adopt: list[str] | None = None):
    return parse_policy(
        namespace_per_group=True,
        namespace_prefix=f"{hub}-",
        profiles=CPU,
        groups={
            "lab": {"quota": {"cpu": 4}, "profiles": ["cpu"]},
            "bio": {"quota": {"cpu": 4}, "profiles": ["cpu"]},
        },
        adopt_namespaces=adopt,
    )


async def written_into(kube, namespace: str) -> list[str]:
    """The quotas, limit ranges and network policies anyone wrote into a namespace."""
    from kubernetes_asyncio import client

    core, net = client.CoreV1Api(kube), client.NetworkingV1Api(kube)
    found = [
        f"ResourceQuota {q.metadata.name}"
        for q in (await core.list_namespaced_resource_quota(namespace)).items
    ]
    found += [
        f"LimitRange {r.metadata.name}"
        for r in (await core.list_namespaced_limit_range(namespace)).items
    ]
    found += [
        f"NetworkPolicy {n.metadata.name}"
        for n in (await net.list_namespaced_network_policy(namespace)).items
    ]
    return found


@pytest.fixture
async def someones_namespace(core, namespace):
    """``<hub>-bio``, made by someone else before the policy named it (no labels of ours)."""
    name = f"{namespace}-bio"
    await core.create_namespace({"metadata": {"name": name, "labels": {"team": "bio"}}})
    yield name
    try:
        live = await core.read_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise
        return  # adopted: gone with the hub's objects
    if live.metadata.deletion_timestamp is None:  # adopted: going with the hub's objects
        await core.delete_namespace(name)


@pytest.mark.k8s
async def test_an_existing_namespace_without_our_labels_is_left_untouched_and_reported(
    kube, core, namespace, someones_namespace
):
    from jupyterhub_gpu.kube.reconciler import Reconciler

    hub = namespace
    reconciler = Reconciler(kube, hub, prune_namespaces=True)
    try:
        report = await reconciler.reconcile(policy_for(hub))
        assert [str(e) for e in report.errors] == [
            f"v1 Namespace {someones_namespace}: exists and is not made by this service (no "
            f"{OWNER_LABEL}={OWNER} label), so nothing is written into it: if this group's "
            "servers are meant to run there, list it in GPUPolicy.adopt_namespaces; "
            "otherwise set GPUPolicy.namespace_prefix or rename the group"
        ]
        assert str(report.errors[0]) in report.summary()
        # nothing written into it, not even a label
        live = await core.read_namespace(someones_namespace)
        assert live.metadata.labels.get(OWNER_LABEL) is None
        assert live.metadata.labels["team"] == "bio"
        assert await written_into(kube, someones_namespace) == []
        # the other group's namespace is made as usual in the same pass
        assert f"Namespace {hub}-lab" in report.created
        assert "ResourceQuota jupyterhub-gpu" in await written_into(kube, f"{hub}-lab")
        # every later pass says the same, and still writes nothing there
        again = await reconciler.reconcile(policy_for(hub))
        assert [e.name for e in again.errors] == [someones_namespace]
        assert again.writes == 0
        # the same namespace made by another hub's service is refused by name
        await core.patch_namespace(
            someones_namespace, {"metadata": {"labels": {OWNER_LABEL: OWNER, HUB_LABEL: "other"}}}
        )
        other = await reconciler.reconcile(policy_for(hub))
        assert other.errors[0].message.startswith(
            f"exists and is the hub's in namespace other (its {HUB_LABEL} label), so nothing "
            "is written into it"
        )
        assert await written_into(kube, someones_namespace) == []
    finally:
        assert (await reconciler.remove_all()).ok
    # and pruning everything never deletes it: it was never ours
    assert (await core.read_namespace(someones_namespace)).metadata.deletion_timestamp is None


@pytest.mark.k8s
async def test_a_namespace_listed_in_adopt_namespaces_is_adopted(
    kube, core, namespace, someones_namespace
):
    from jupyterhub_gpu.kube.reconciler import Reconciler

    hub = namespace
    reconciler = Reconciler(kube, hub)
    try:
        report = await reconciler.reconcile(policy_for(hub, adopt=[someones_namespace]))
        assert report.ok, report.summary()
        assert report.adopted == [
            f"Namespace {someones_namespace}: existed without this hub's labels; adopted, as "
            "GPUPolicy.adopt_namespaces lists it"
        ]
        assert f"  adopted Namespace {someones_namespace}" in report.summary()
        labels = (await core.read_namespace(someones_namespace)).metadata.labels
        assert labels[OWNER_LABEL] == OWNER
        assert labels[HUB_LABEL] == hub
        assert labels["team"] == "bio"  # what others wrote stays
        assert sorted(await written_into(kube, someones_namespace)) == [
            "LimitRange jupyterhub-gpu",
            "NetworkPolicy jupyterhub-gpu-isolate-groups",
            "ResourceQuota jupyterhub-gpu",
        ]
        # from then on it is ours like any other: a later pass has nothing to do
        again = await reconciler.reconcile(policy_for(hub, adopt=[someones_namespace]))
        assert again.ok, again.summary()
        assert again.adopted == []
        assert again.writes == 0
    finally:
        assert (await reconciler.remove_all()).ok


@pytest.mark.k8s
async def test_the_reconciler_writes_nothing_into_the_hubs_own_namespace(kube, core, namespace):
    from jupyterhub_gpu.kube.reconciler import Reconciler

    hub = namespace
    policy = parse_policy(
        namespace_per_group=True,
        namespace_prefix="",
        profiles=CPU,
        groups={hub: {"quota": {"cpu": 4}, "profiles": ["cpu"]}},
        # even listed for adoption: the hub's namespace is never a group's
        adopt_namespaces=[hub],
    )
    reconciler = Reconciler(kube, hub)
    try:
        report = await reconciler.reconcile(policy)
        assert [str(e) for e in report.errors] == [
            f"v1 Namespace {hub}: is the hub's own namespace, where the hub, the proxy and "
            "servers from before the policy run: nothing is written into it; set "
            "GPUPolicy.namespace_prefix (e.g. 'jh-') or rename the group"
        ]
        # the cluster-wide PriorityClasses only: nothing in the namespace, nor to it
        assert [c for c in report.created if not c.startswith("PriorityClass ")] == []
        assert await written_into(kube, hub) == []
        assert (await core.read_namespace(hub)).metadata.labels.get(OWNER_LABEL) is None
    finally:
        assert (await reconciler.remove_all()).ok
