"""What servers in group namespaces may connect to (``GPUPolicy.egress``): rendered as a
NetworkPolicy (pure), and that NetworkPolicy accepted by the real API server."""

from __future__ import annotations

import pytest

from jupyterhub_gpu.core.manifests import desired_objects
from jupyterhub_gpu.core.model import PRIVATE_RANGES, parse_policy

HUB = "jhub"
DNS = {
    "to": [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        },
        {"ipBlock": {"cidr": "169.254.20.10/32"}},
    ],
    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
}
HUB_AND_PROXY = {
    "to": [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": HUB}},
            "podSelector": {
                "matchExpressions": [
                    {"key": "component", "operator": "In", "values": ["hub", "proxy"]}
                ]
            },
        }
    ]
}
SAME_NAMESPACE = {"to": [{"podSelector": {}}]}
DATASETS = {
    "by-address": {"nfs": {"server": "100.64.1.3", "path": "/export/a"}, "mount_path": "/data/a"},
    "by-name": {"nfs": {"server": "nfs.example.edu", "path": "/export/b"}, "mount_path": "/data/b"},
    "other": {"nfs": {"server": "100.64.9.9", "path": "/export/c"}, "mount_path": "/data/c"},
}


def policy(egress, prefix: str = "jh-", **extra):
    return parse_policy(
        namespace_per_group=True,
        namespace_prefix=prefix,
        profiles={"cpu": {"cpu": 1, "memory": "1Gi"}},
        datasets=DATASETS,
        groups={
            "lab": {"profiles": ["cpu"], "datasets": ["by-address", "by-name"]},
            "bio": {"profiles": ["cpu"], "datasets": ["other"]},
        },
        egress=egress,
        **extra,
    )


def egress_of(objects, namespace: str):
    found = [
        o
        for o in objects
        if o["kind"] == "NetworkPolicy"
        and o["metadata"]["name"] == "jupyterhub-gpu-egress"
        and o["metadata"]["namespace"] == namespace
    ]
    return found[0] if found else None


def test_without_egress_no_group_namespace_gets_an_egress_rule():
    objects = desired_objects(policy(None), HUB)
    assert [o for o in objects if "Egress" in o.get("spec", {}).get("policyTypes", [])] == []


def test_by_default_servers_reach_the_internet_dns_hub_and_proxy_but_no_private_address():
    objects = desired_objects(policy({}), HUB)
    lab = egress_of(objects, "jh-lab")
    assert lab["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "jupyterhub-gpu",
        "gpu.jupyterhub.org/hub-namespace": HUB,
    }
    assert lab["spec"]["podSelector"] == {}  # every pod of the group namespace
    assert lab["spec"]["policyTypes"] == ["Egress"]
    same, dns, hub, addresses = lab["spec"]["egress"]
    assert (same, dns, hub) == (SAME_NAMESPACE, DNS, HUB_AND_PROXY)
    assert addresses == {
        "to": [
            {
                "ipBlock": {
                    "cidr": "0.0.0.0/0",
                    "except": [
                        "10.0.0.0/8",
                        "172.16.0.0/12",
                        "192.168.0.0/16",
                        "100.64.0.0/10",
                        "169.254.0.0/16",
                    ],
                }
            },
            {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}},
            # the group's own NFS server given by address (the one by name has none here)
            {"ipBlock": {"cidr": "100.64.1.3/32"}},
        ]
    }
    # each group gets its own datasets' servers, and nobody else's
    bio = egress_of(objects, "jh-bio")
    assert bio["spec"]["egress"][3]["to"][2:] == [{"ipBlock": {"cidr": "100.64.9.9/32"}}]
    assert all(p["ipBlock"]["cidr"] != "100.64.9.9/32" for p in lab["spec"]["egress"][3]["to"])
    # the ingress isolation stays as it was
    assert any(
        o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "jupyterhub-gpu-isolate-groups"
        for o in objects
    )


def test_listed_networks_are_allowed_and_extra_ones_denied_by_address_family():
    objects = desired_objects(
        policy(
            {
                "allow_cidrs": ["100.64.20.0/24", "2001:db8:1::/48"],
                "deny_cidrs": ["198.51.100.0/24", "2001:db8::/32"],
                "allow_dataset_servers": False,
            }
        ),
        HUB,
    )
    to = egress_of(objects, "jh-lab")["spec"]["egress"][3]["to"]
    assert to == [
        {
            "ipBlock": {
                "cidr": "0.0.0.0/0",
                "except": [*(r for r in PRIVATE_RANGES if ":" not in r), "198.51.100.0/24"],
            }
        },
        {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10", "2001:db8::/32"]}},
        {"ipBlock": {"cidr": "100.64.20.0/24"}},
        {"ipBlock": {"cidr": "2001:db8:1::/48"}},
    ]


def test_without_the_public_internet_only_what_is_listed_is_reachable():
    objects = desired_objects(
        policy({"allow_public": False, "allow_cidrs": ["100.64.20.0/24"]}), HUB
    )
    rules = egress_of(objects, "jh-lab")["spec"]["egress"]
    assert rules[:3] == [SAME_NAMESPACE, DNS, HUB_AND_PROXY]
    assert rules[3] == {
        "to": [{"ipBlock": {"cidr": "100.64.20.0/24"}}, {"ipBlock": {"cidr": "100.64.1.3/32"}}]
    }
    # nothing listed, no dataset server: DNS, the hub and proxy, and the namespace only
    bare = policy({"allow_public": False, "allow_dataset_servers": False})
    assert egress_of(desired_objects(bare, HUB), "jh-lab")["spec"]["egress"] == [
        SAME_NAMESPACE,
        DNS,
        HUB_AND_PROXY,
    ]


def test_private_networks_only_an_intranet_cluster():
    # public denied, private allowed (an air-gapped site): the private ranges are the rule
    objects = desired_objects(
        policy({"allow_public": False, "deny_private": False, "allow_dataset_servers": False}),
        HUB,
    )
    to = egress_of(objects, "jh-lab")["spec"]["egress"][3]["to"]
    assert to == [{"ipBlock": {"cidr": r}} for r in PRIVATE_RANGES]


@pytest.mark.k8s
async def test_the_api_server_accepts_the_egress_rule_as_the_reconciler_applies_it(kube, namespace):
    from kubernetes_asyncio import client

    from jupyterhub_gpu.kube.reconciler import Reconciler

    hub = namespace
    egress = {
        "allow_cidrs": ["100.64.20.0/24", "2001:db8:1::/48"],
        "deny_cidrs": ["198.51.100.0/24"],
    }
    wanted = policy(egress, prefix=f"{hub}-")
    reconciler = Reconciler(kube, hub)
    try:
        report = await reconciler.reconcile(wanted)
        assert report.ok, report.summary()
        assert f"NetworkPolicy {hub}-lab/jupyterhub-gpu-egress" in report.created
        live = await client.NetworkingV1Api(kube).read_namespaced_network_policy(
            "jupyterhub-gpu-egress", f"{hub}-lab"
        )
        assert live.spec.policy_types == ["Egress"]
        blocks = [p.ip_block.cidr for p in live.spec.egress[3].to]
        assert blocks == ["0.0.0.0/0", "::/0", "100.64.20.0/24", "2001:db8:1::/48", "100.64.1.3/32"]
        assert "198.51.100.0/24" in live.spec.egress[3].to[0].ip_block._except
        # a second pass finds it as applied: the API server kept every field
        again = await reconciler.reconcile(wanted)
        assert again.ok, again.summary()
        assert again.writes == 0
    finally:
        assert (await reconciler.remove_all()).ok
