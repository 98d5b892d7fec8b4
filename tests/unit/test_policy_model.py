"""Policy validation: every error named with its full key path, nothing ignored."""

from __future__ import annotations

from fractions import Fraction

import pytest

from jupyterhub_gpu.core.model import Budget, Idle, PolicyError, parse_policy

P = "hub.config.GPUPolicy"


def errors(**policy) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(**policy)
    return info.value.errors


def test_design_example_policy_is_valid_and_counts_gpu_equivalents():
    policy = parse_policy(
        scheduler={"name": "kai"},
        flavors={
            "h200": {
                "kind": "gpu",
                "resource": "nvidia.com/gpu",
                "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"},
            },
            "h200-shared": {
                "kind": "timeslice",
                "resource": "nvidia.com/gpu.shared",
                "replicas": 4,
            },
            "mig-1g5": {"kind": "mig", "profile": "1g.5gb", "strategy": "mixed"},
            "mig-3g": {"kind": "mig", "profile": "3g.20gb"},
            "slice-32g": {"kind": "fraction", "gpu_memory": 32000},
        },
        profiles={
            "cpu": {"display_name": "CPU only", "cpu": 2, "memory": "2Gi"},
            "student": {"cpu": 4, "memory": "16Gi", "gpu": {"flavor": "slice-32g"}},
            "research": {
                "cpu": 8,
                "memory": "64Gi",
                "gpu": {"flavor": "h200", "count": 1},
                "options": {
                    "gpus": {"choices": [1, 2, 4]},
                    "flavor": {"choices": ["h200", "h200-shared"]},
                },
            },
        },
        everyone={"profiles": ["cpu"]},
        groups={
            "research": {
                "quota": {"gpus": 12, "cpu": 64, "memory": "131Gi"},
                "limit": {"gpus": 24},
                "per_user": {"servers": 2, "gpus": 4},
                "profiles": ["research", "cpu"],
            },
            "students": {
                "quota": {"gpus": 10},
                "per_user": {"servers": 1},
                "max_runtime": "8h",
                "profiles": ["student"],
            },
            "test": {"unlimited": True, "profiles": ["research", "student", "cpu"]},
        },
    )
    f = policy.flavors
    assert f["h200"].unit_equivalents == 1
    assert f["h200-shared"].unit_equivalents == Fraction(1, 4)
    assert f["mig-1g5"].unit_equivalents == Fraction(1, 7)
    assert f["mig-3g"].unit_equivalents == Fraction(3, 7)
    assert f["mig-1g5"].resource == "nvidia.com/mig-1g.5gb"
    # no device memory given: a fraction is charged a whole GPU (never under-counted)
    assert f["slice-32g"].unit_equivalents == 1
    research = policy.groups["research"]
    assert research.quota.gpus == 12
    assert research.limit.gpus == 24
    assert research.limit.cpu == 64000  # unset limit fields default to the quota
    assert research.quota.memory == 131 * 2**30
    assert research.queue == "research"
    assert policy.groups["students"].max_runtime == 8 * 3600


def test_the_design_example_error_message():
    assert errors(
        groups={"students": {"quota": {"gpus": "ten"}}},
    ) == [f"{P}.groups.students.quota.gpus: expected a number, got 'ten'"]


def test_every_error_is_reported_not_just_the_first():
    found = errors(
        scheduler={"name": "slurm"},
        flavors={"x": {"kind": "gpu", "colour": "red"}, "y": {"kind": "tpu"}},
        profiles={"p": {"gpu": {"flavor": "nope"}, "memory": "lots"}},
        groups={
            "a": {"profiles": ["missing"], "parent": "ghost"},
            "b": {"quota": {"gpus": 4}, "limit": {"gpus": 2}, "when_full": "queue"},
        },
        when_full="panic",
    )
    expected = [
        f"{P}.scheduler.name: expected one of default, kai, volcano, kueue, got 'slurm'",
        f"{P}.flavors.x.colour: unknown key",
        f"{P}.flavors.y.kind: expected one of gpu, mig, timeslice, mps, fraction, hami, dra",
        f"{P}.profiles.p.memory: expected a quantity such as 4, 500m or 16Gi, got 'lots'",
        f"{P}.profiles.p.gpu.flavor: no flavor named 'nope'",
        f"{P}.groups.a.profiles[0]: no profile named 'missing'",
        f"{P}.groups.a.parent: no group named 'ghost'",
        f"{P}.groups.b.limit.gpus: must be >= quota.gpus",
        f"{P}.groups.b.when_full: expected refuse or wait, got 'queue'",
        f"{P}.when_full: expected refuse or wait, got 'panic'",
    ]
    for message in expected:
        assert any(e.startswith(message) for e in found), (message, found)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            {"flavors": {"s": {"kind": "fraction", "gpu_fraction": 0.5}}},
            "flavors.s.kind: fraction flavors need the KAI scheduler",
        ),
        (
            {"scheduler": "kai", "flavors": {"s": {"kind": "fraction"}}},
            "flavors.s: set exactly one of gpu_fraction",
        ),
        (
            {"scheduler": "kai", "flavors": {"s": {"kind": "fraction", "gpu_fraction": 1.5}}},
            "flavors.s.gpu_fraction: expected a number between 0 and 1",
        ),
        (
            {"flavors": {"m": {"kind": "mig", "profile": "9g.80gb"}}},
            "flavors.m.profile: expected a MIG profile",
        ),
        (
            {"flavors": {"m": {"kind": "mig", "profile": "1g.5gb", "strategy": "single"}}},
            "flavors.m.product: required with strategy: single",
        ),
        ({"flavors": {"t": {"kind": "timeslice"}}}, "flavors.t.replicas: expected a whole number"),
        (
            {"groups": {"a": {"parent": "b"}, "b": {"parent": "a"}}},
            "groups.a.parent: cycle: a -> b -> a",
        ),
        (
            {
                "flavors": {"g": {"kind": "gpu"}},
                "profiles": {"p": {"gpu": {"flavor": "g"}}},
                "groups": {"a": {"profiles": ["p"]}},
            },
            "groups.a.quota.gpus: required: the group offers GPU profiles (p)",
        ),
        (
            {"groups": {"a": {"unlimited": True, "quota": {"gpus": 1}}}},
            "groups.a.unlimited: an unlimited group has no quota or limit",
        ),
        (
            {"profiles": {"p": {"kubespawner_override": {"cpu_guarantee": 64}}}},
            "profiles.p.kubespawner_override.cpu_guarantee: is set by the policy",
        ),
        (
            {"profiles": {"p": {"cpu": 2, "cpu_limit": 1}}},
            "profiles.p.cpu_limit: must be >= cpu",
        ),
        ({"groups": {"a--b": {}}}, "groups.a--b: a group name must be"),
        ({"groups": {"everyone": {}}}, "groups.everyone: 'everyone' is the top-level"),
        ({"everyone": {"parent": "x"}}, "everyone.parent: unknown key"),
        (
            {
                "flavors": {"g": {"kind": "gpu"}},
                "profiles": {
                    "p": {
                        "gpu": {"flavor": "g", "count": 3},
                        "options": {"gpus": {"choices": [1, 2]}},
                    }
                },
            },
            "profiles.p.options.gpus.choices: must include the profile's gpu.count (3)",
        ),
        ({"extra_labels": {"team": "{tenant}"}}, "extra_labels.team: unknown placeholder"),
        (
            {"groups": {"a": {"max_runtime": "forever"}}},
            "groups.a.max_runtime: expected a duration",
        ),
        (
            {
                "flavors": {"g": {"kind": "gpu"}},
                "profiles": {
                    "p": {
                        "gpu": {"flavor": "g"},
                        "options": {
                            "gpus": {
                                "choices": [1, 2],
                                "unlisted_choice": {"validation_regex": "."},
                            }
                        },
                    }
                },
            },
            "profiles.p.options.gpus.unlisted_choice: only the image option takes unlisted",
        ),
        (
            {
                "profiles": {
                    "p": {
                        "options": {
                            "image": {
                                "choices": ["a"],
                                "unlisted_choice": {"validation_regex": "(unclosed"},
                            }
                        }
                    }
                }
            },
            "profiles.p.options.image.unlisted_choice.validation_regex: not a regular expression",
        ),
        (
            {"namespace_per_group": True, "groups": {"Data_Science": {}, "data-science": {}}},
            "groups.data-science: with namespace_per_group its namespace "
            "'jupyterhub-gpu-data-science' is also Data_Science's",
        ),
        (
            {"namespace_per_group": True, "namespace_prefix": "_"},
            "namespace_prefix: '_' cannot start a namespace name",
        ),
        (
            {"groups": {"a": {"budget": {"gpu_hours": "lots", "period": "7d"}}}},
            "groups.a.budget.gpu_hours: expected a number, got 'lots'",
        ),
        (
            {"groups": {"a": {"budget": {"gpu_hours": 0, "period": "7d"}}}},
            "groups.a.budget.gpu_hours: expected a positive number, got 0",
        ),
        (
            {"groups": {"a": {"budget": {"gpu_hours": 10}}}},
            "groups.a.budget.period: required",
        ),
        (
            {"groups": {"a": {"budget": {"gpu_hours": 10, "period": "a month"}}}},
            "groups.a.budget.period: expected a duration",
        ),
        (
            {"groups": {"a": {"budget": {"gpu_hours": 1, "period": "1d", "when_exhausted": "x"}}}},
            "groups.a.budget.when_exhausted: expected warn or stop, got 'x'",
        ),
        (
            {"groups": {"a": {"budget": {"gpu_hours": 1, "period": "1d", "grace": "5m"}}}},
            "groups.a.budget.grace: only a budget with when_exhausted: stop",
        ),
        (
            {"groups": {"a": {"budget": {"gpu_hours": 1, "period": "1d", "gpu_minutes": 5}}}},
            "groups.a.budget.gpu_minutes: unknown key",
        ),
        (
            {"groups": {"a": {"per_user": {"budget": {"gpu_hours": -1, "period": "1d"}}}}},
            "groups.a.per_user.budget.gpu_hours: expected a number >= 0, got -1",
        ),
        (
            {"groups": {"a": {"unlimited": True, "budget": {"gpu_hours": 1, "period": "1d"}}}},
            "groups.a.budget: an unlimited group has no budget",
        ),
        (
            {"groups": {"a": {"idle": {"gpu_utilization_below": 5}}}},
            "groups.a.idle.after: required",
        ),
        (
            {"groups": {"a": {"idle": {"after": "soon"}}}},
            "groups.a.idle.after: expected a duration",
        ),
        (
            {"groups": {"a": {"idle": {"after": "1h", "gpu_utilization_below": 150}}}},
            "groups.a.idle.gpu_utilization_below: expected a percentage above 0 and at most 100",
        ),
    ],
)
def test_impossible_policies_are_refused_with_the_key_path(policy, message):
    found = errors(**policy)
    assert any(e.startswith(f"{P}.{message}") for e in found), found


def test_budgets_and_idle_rules_are_read_with_their_defaults():
    policy = parse_policy(
        groups={
            "research": {
                "budget": {"gpu_hours": 2000, "period": "30d"},
                "per_user": {"servers": 2, "budget": {"gpu_hours": 300, "period": "7d"}},
                "idle": {"after": "2h", "gpu_utilization_below": 5},
            },
            "students": {
                "budget": {
                    "gpu_hours": 40,
                    "period": "7d",
                    "when_exhausted": "stop",
                    "grace": "15m",
                }
            },
        }
    )
    research, students = policy.groups["research"], policy.groups["students"]
    assert research.budget == Budget(gpu_hours=2000, period=30 * 86400)
    assert research.budget.when_exhausted == "warn"
    assert research.user_budget == Budget(gpu_hours=300, period=7 * 86400)
    assert research.per_user.servers == 2
    assert research.idle == Idle(after=7200, gpu_utilization_below=5.0)
    assert students.budget == Budget(
        gpu_hours=40, period=7 * 86400, when_exhausted="stop", grace=900
    )
    assert students.user_budget is None
    assert students.idle is None


def test_fair_share_and_group_shares_are_read_for_the_waiting_line_and_the_schedulers():
    policy = parse_policy(
        fair_share={"half_life": "7d", "max_wait": "30m"},
        groups={"research": {"share": 3}, "nlp": {"parent": "research", "share": 0.5}, "bio": {}},
    )
    assert (policy.fair_share.half_life, policy.fair_share.max_wait) == (7 * 86400, 1800)
    assert [g.share for g in policy.groups.values()] == [3.0, 0.5, 1.0]
    assert policy.everyone.share == 1.0
    # max_wait defaults to an hour: nobody waits for ever
    assert parse_policy(fair_share={"half_life": "2d"}).fair_share.max_wait == 3600
    # without fair_share the line is first come, first served
    assert parse_policy().fair_share is None


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            {"fair_share": {"half_life": "soon"}},
            "fair_share.half_life: expected a duration like 7d, got 'soon'",
        ),
        (
            {"fair_share": {"half_life": "7d", "max_wait": -5}},
            "fair_share.max_wait: expected a duration like 30m, got -5",
        ),
        ({"fair_share": {"max_wait": "30m"}}, "fair_share.half_life: required"),
        (
            {"fair_share": {"half_life": "7d", "halflife": "7d"}},
            "fair_share.halflife: unknown key (allowed here: count, half_life, max_wait)",
        ),
        (
            {"fair_share": {"half_life": "7d", "count": "units"}},
            "fair_share.count: expected gpu_hours or billed_units, got 'units'",
        ),
        ({"fair_share": "7d"}, "fair_share: expected a mapping like {half_life: 7d"),
        ({"fair_share": {}}, "fair_share: expected a mapping like {half_life: 7d"),
        (
            {"groups": {"a": {"share": 0}}},
            "groups.a.share: expected a number above 0 such as 1 or 2.5, got 0",
        ),
        ({"groups": {"a": {"share": -1}}}, "groups.a.share: expected a number above 0"),
        ({"groups": {"a": {"share": "lots"}}}, "groups.a.share: expected a number above 0"),
        ({"groups": {"a": {"share": True}}}, "groups.a.share: expected a number above 0"),
        ({"everyone": {"share": 0}}, "everyone.share: expected a number above 0"),
    ],
)
def test_fair_share_mistakes_are_named_with_their_key_path(policy, message):
    found = errors(**policy)
    assert any(e.startswith(f"{P}.{message}") for e in found), found


def test_fair_share_is_read_from_the_hubs_config_with_its_key_path():
    from traitlets.config import Config

    from jupyterhub_gpu.config.policy import GPUPolicy

    config = Config()
    config.GPUPolicy.fair_share = {"half_life": "1d", "max_wait": "10m"}
    config.GPUPolicy.groups = {"a": {"share": 2}}
    policy = GPUPolicy(config=config).model
    assert policy.fair_share.max_wait == 600
    assert policy.groups["a"].share == 2
    # unset, it is off (and the policy valid): first come, first served
    unset = Config()
    unset.GPUPolicy.groups = {"a": {}}
    assert GPUPolicy(config=unset).model.fair_share is None
    config.GPUPolicy.fair_share = {"half_life": "soon"}
    with pytest.raises(PolicyError) as info:
        _ = GPUPolicy(config=config).model
    assert info.value.errors == [
        f"{P}.fair_share.half_life: expected a duration like 7d, got 'soon'"
    ]


# ---- namespaces the policy may never take, and the ones it may adopt ----------------


@pytest.mark.parametrize("group", ["kube-system", "kube-public", "kube-node-lease", "default"])
def test_a_group_whose_namespace_would_be_a_system_namespace_is_refused(group):
    found = errors(namespace_per_group=True, namespace_prefix="", groups={group: {}, "lab": {}})
    assert found == [
        f"{P}.groups.{group}: with namespace_per_group its namespace would be {group!r}, one "
        "of Kubernetes' own, where the GPU service's quota, network policy and ownership "
        "labels would take over the cluster's services: set namespace_prefix (e.g. 'jh-') "
        "or rename the group"
    ]
    # the same names are fine where they name no namespace
    assert parse_policy(namespace_prefix="", groups={group: {}}).groups[group]
    # and with a prefix, the namespace is the prefix's
    assert parse_policy(namespace_per_group=True, groups={group: {}}).groups[group]


def test_a_kube_prefix_is_refused_once_at_the_prefix():
    assert errors(namespace_per_group=True, namespace_prefix="kube-", groups={"a": {}}) == [
        f"{P}.namespace_prefix: 'kube-' makes every group's namespace a kube-* name, which "
        "Kubernetes reserves for its own namespaces: use e.g. 'jh-'"
    ]
    # a group that spells its way into kube-* is refused too
    found = errors(namespace_per_group=True, namespace_prefix="", groups={"Kube_DNS": {}})
    assert found[0].startswith(f"{P}.groups.Kube_DNS: with namespace_per_group its namespace ")
    assert "'kube-dns'" in found[0]


def test_a_group_namespace_that_is_the_hubs_own_is_named_with_its_key_path():
    from jupyterhub_gpu.core.model import hub_namespace_errors

    policy = parse_policy(
        namespace_per_group=True,
        namespace_prefix="",
        profiles={"cpu": {"cpu": 1, "memory": "1Gi"}},
        everyone={"profiles": ["cpu"]},
        groups={"jhub": {"profiles": ["cpu"]}, "lab": {"profiles": ["cpu"]}},
    )
    assert hub_namespace_errors(policy, "jhub") == [
        f"{P}.groups.jhub: with namespace_per_group its namespace 'jhub' is the hub's own, "
        "where the hub, the proxy and servers from before the policy run: set "
        "namespace_prefix (e.g. 'jh-') or rename the group"
    ]
    assert hub_namespace_errors(policy, "everyone") == [
        f"{P}.everyone: with namespace_per_group its namespace 'everyone' is the hub's own, "
        "where the hub, the proxy and servers from before the policy run: set "
        "namespace_prefix (e.g. 'jh-') or rename the group"
    ]
    assert hub_namespace_errors(policy, "jupyterhub") == []
    # without a namespace per group, every server is in the hub's namespace by design
    same = parse_policy(namespace_prefix="", groups={"jhub": {}})
    assert hub_namespace_errors(same, "jhub") == []


def test_adopt_namespaces_lists_the_policys_own_group_namespaces():
    policy = parse_policy(
        namespace_per_group=True,
        namespace_prefix="jh-",
        groups={"lab": {}, "Bio_Lab": {}},
        adopt_namespaces=["jh-lab", "jh-bio-lab"],
    )
    assert policy.adopt_namespaces == ("jh-lab", "jh-bio-lab")
    assert parse_policy().adopt_namespaces == ()


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            {"adopt_namespaces": ["jh-lab"], "namespace_per_group": False},
            "adopt_namespaces: only group namespaces are ever adopted, and there are none "
            "without namespace_per_group: turn namespace_per_group on, or remove "
            "adopt_namespaces",
        ),
        (
            {"adopt_namespaces": "jh-lab"},
            "adopt_namespaces: expected a list of namespace names, got 'jh-lab'",
        ),
        (
            {"adopt_namespaces": ["kube-system"]},
            "adopt_namespaces[0]: 'kube-system' is not a group namespace of this policy, and "
            "no other namespace is ever adopted: name one of jh-everyone, jh-lab, or remove it",
        ),
        ({"adopt_namespaces": [None]}, "adopt_namespaces[0]: expected a namespace name, got None"),
        (
            {"adopt_namespaces": ["jh-lab", "jh-lab"]},
            "adopt_namespaces[1]: 'jh-lab' is listed twice",
        ),
    ],
)
def test_adopt_namespaces_mistakes_are_named_with_their_key_path(policy, message):
    policy = {
        "namespace_per_group": True,
        "namespace_prefix": "jh-",
        "groups": {"lab": {}},
        **policy,
    }
    assert errors(**policy) == [f"{P}.{message}"]


def test_egress_is_off_unless_set_and_on_with_its_defaults_when_set():
    from jupyterhub_gpu.core.model import Egress

    assert parse_policy(namespace_per_group=True).egress is None
    policy = parse_policy(namespace_per_group=True, egress={})
    assert policy.egress == Egress(deny_private=True, allow_public=True)
    policy = parse_policy(
        namespace_per_group=True,
        egress={
            "allow_cidrs": ["10.20.0.0/16", "192.0.2.7", "2001:db8::/32"],
            "deny_cidrs": ["198.51.100.0/24"],
            "allow_dataset_servers": False,
        },
    )
    # a bare address is that one address; networks are written as Kubernetes reads them
    assert policy.egress.allow_cidrs == ("10.20.0.0/16", "192.0.2.7/32", "2001:db8::/32")
    assert policy.egress.deny_cidrs == ("198.51.100.0/24",)
    assert policy.egress.allow_dataset_servers is False


@pytest.mark.parametrize(
    ("egress", "message"),
    [
        (
            {"deny_privat": True},
            "egress.deny_privat: unknown key (allowed here: allow_cidrs, allow_dataset_servers, "
            "allow_public, deny_cidrs, deny_private)",
        ),
        (
            "on",
            "egress: expected a mapping like {deny_private: true, allow_cidrs: [198.51.100.0/24]}",
        ),
        ({"allow_public": "yes"}, "egress.allow_public: expected true or false, got 'yes'"),
        ({"deny_private": 1}, "egress.deny_private: expected true or false, got 1"),
        (
            {"allow_cidrs": ["10.0.0.1/8"]},
            "egress.allow_cidrs[0]: '10.0.0.1/8' has host bits set: write '10.0.0.0/8'",
        ),
        (
            {"allow_cidrs": ["10.0.0.0/8", "licence-server"]},
            "egress.allow_cidrs[1]: expected a network like 198.51.100.0/24, got 'licence-server'",
        ),
        (
            {"deny_cidrs": [8]},
            "egress.deny_cidrs[0]: expected a network like 198.51.100.0/24, got 8",
        ),
        (
            {"allow_cidrs": "10.0.0.0/8"},
            "egress.allow_cidrs: expected a list of networks like [198.51.100.0/24], got "
            "'10.0.0.0/8'",
        ),
        (
            {"allow_cidrs": ["10.2.0.0/16", "10.2.0.0/16"]},
            "egress.allow_cidrs[1]: '10.2.0.0/16' is listed twice",
        ),
        (
            {"deny_private": False},
            "egress: denies nothing (deny_private: false, allow_public: true and no "
            "deny_cidrs): set deny_private: true, list deny_cidrs, or remove egress",
        ),
        (
            {"allow_public": False, "deny_cidrs": ["198.51.100.0/24"]},
            "egress.deny_cidrs: has no effect with allow_public: false, which denies every "
            "address not allowed: remove deny_cidrs, or allow_public",
        ),
    ],
)
def test_egress_mistakes_are_named_with_their_key_path(egress, message):
    found = errors(namespace_per_group=True, egress=egress)
    assert len(found) == 1, found
    assert found[0].startswith(f"{P}.{message}"), found


def test_egress_needs_a_namespace_per_group():
    assert errors(egress={}) == [
        f"{P}.egress: applies to group namespaces, and there are none without "
        "namespace_per_group: turn namespace_per_group on (servers in the hub's namespace "
        "are z2jh's singleuser.networkPolicy's to restrict)"
    ]


def test_egress_and_adopt_namespaces_are_read_from_the_hubs_config():
    from traitlets.config import Config

    from jupyterhub_gpu.config.policy import GPUPolicy

    config = Config()
    config.GPUPolicy.namespace_per_group = True
    config.GPUPolicy.groups = {"lab": {}}
    assert GPUPolicy(config=config).model.egress is None
    config.GPUPolicy.egress = {"allow_cidrs": ["10.9.0.0/16"]}
    config.GPUPolicy.adopt_namespaces = ["jupyterhub-gpu-lab"]
    policy = GPUPolicy(config=config).model
    assert policy.egress.allow_cidrs == ("10.9.0.0/16",)
    assert policy.adopt_namespaces == ("jupyterhub-gpu-lab",)
    config.GPUPolicy.egress = {"allow_cidrs": ["10.9.0.1/16"]}
    with pytest.raises(PolicyError) as info:
        _ = GPUPolicy(config=config).model
    assert info.value.errors == [
        f"{P}.egress.allow_cidrs[0]: '10.9.0.1/16' has host bits set: write '10.9.0.0/16'"
    ]
