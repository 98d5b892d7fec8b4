"""Admission arithmetic: no group ever passes its limit, and the ledger is exactly its pods."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from jupyterhub_gpu.core.admission import IN_QUOTA, OVER_QUOTA, Charge, Ledger, Usage
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.selection import Request, base_request, offers

POLICY = parse_policy(
    flavors={
        "h200": {"kind": "gpu"},
        "shared": {"kind": "timeslice", "replicas": 4},
        "mig": {"kind": "mig", "profile": "3g.20gb"},
    },
    profiles={"p": {"gpu": {"flavor": "h200"}}},
    when_full="wait",
    groups={
        "dept": {"quota": {"gpus": 6}, "limit": {"gpus": 8, "flavors": {"h200": 6}}},
        "lab-a": {
            "parent": "dept",
            "quota": {"gpus": 3, "cpu": 16},
            "limit": {"gpus": 5},
            "per_user": {"servers": 2, "gpus": 3},
            "profiles": ["p"],
        },
        "lab-b": {"parent": "dept", "quota": {"gpus": 4}, "limit": {"gpus": 6}, "profiles": ["p"]},
        "admins": {"unlimited": True},
    },
)
FLAVOR_EQ = {name: f.unit_equivalents for name, f in POLICY.flavors.items()}


def request(flavor: str, units: int, cpu: int = 1000) -> Request:
    return Request(
        gpus=FLAVOR_EQ[flavor] * units, cpu=cpu, memory=2**30, devices=((flavor, units),)
    )


def recompute(ledger: Ledger) -> dict[str, Usage]:
    """What the per-group totals must be, summed afresh from the charges (the pods)."""
    totals: dict[str, Usage] = {}
    for charge in ledger.charges.values():
        for group in POLICY.ancestors(charge.group):
            totals.setdefault(group.name, Usage()).add(charge.request)
    return {k: v for k, v in totals.items() if not v.is_zero()}


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("admit"),
            st.sampled_from(["lab-a", "lab-b", "dept", "admins"]),
            st.sampled_from(["u1", "u2", "u3"]),
            st.sampled_from(["h200", "shared", "mig"]),
            st.integers(1, 3),
            st.integers(0, 20),
        ),
        st.tuples(st.just("release"), st.integers(0, 20)),
    ),
    max_size=60,
)


def fits(charges: dict[str, Charge], key: str, user: str, group: str, wanted: Request) -> bool:
    """Whether ``wanted`` fits every cap, summed afresh from the other charges."""
    others = [c for k, c in charges.items() if k != key]

    def over(caps, charged: list[Charge]) -> bool:
        used = Usage()
        for charge in charged:
            used.add(charge.request)
        used.add(wanted)
        pairs = [
            (caps.gpus, used.gpus),
            (caps.cpu, used.cpu),
            (caps.memory, used.memory),
            (caps.servers, used.servers),
        ]
        pairs += [(cap, used.flavors[flavor]) for flavor, cap in caps.flavors.items()]
        return any(cap is not None and value > cap for cap, value in pairs)

    mine = [c for c in others if c.user == user and c.group == group]
    if over(POLICY.group(group).per_user, mine):
        return False
    for level in POLICY.ancestors(group):
        below = {g.name for g in POLICY.groups.values() if level in POLICY.ancestors(g.name)}
        if not level.unlimited and over(level.limit, [c for c in others if c.group in below]):
            return False
    return True


@settings(max_examples=300, deadline=None)
@given(operations)
def test_no_sequence_of_admits_and_releases_passes_a_limit(ops):
    ledger = Ledger()
    for op in ops:
        if op[0] == "admit":
            _, group, user, flavor, units, key = op
            before = dict(ledger.charges)
            wanted = request(flavor, units)
            decision = ledger.admit(POLICY, f"ns/pod-{key}", user, POLICY.group(group), wanted)
            assert decision.outcome in ("admit", "wait", "refuse")
            # exactly what fits is admitted: a ledger refusing everything fails here
            assert decision.admitted == fits(before, f"ns/pod-{key}", user, group, wanted)
            if not decision.admitted:
                # a refusal leaves every charge as it was, the key's own included
                assert ledger.charges == before
        else:
            ledger.release(POLICY, f"ns/pod-{op[1]}")
        # invariant 1: every limited group is at or under its limit, parents included
        for name, group in POLICY.groups.items():
            used = ledger.usage(name)
            if not group.unlimited and group.limit.gpus is not None:
                assert used.gpus <= group.limit.gpus
            for flavor, cap in group.limit.flavors.items():
                assert used.flavors[flavor] <= cap
        # per-user caps hold
        for (_user, group), used in ledger.users.items():
            caps = POLICY.group(group).per_user
            if caps.servers is not None:
                assert used.servers <= caps.servers
            if caps.gpus is not None:
                assert used.gpus <= caps.gpus
        # invariant 2: the running totals equal the sum recomputed from the charges
        assert {k: v for k, v in ledger.groups.items()} == recompute(ledger)
        # and a ledger rebuilt from the charges alone (a hub restart) is the same
        rebuilt = Ledger.from_charges(POLICY, ledger.charges.values())
        assert rebuilt.groups == ledger.groups
        assert rebuilt.users == ledger.users


def test_tier_is_over_quota_between_quota_and_limit_and_wait_beyond():
    ledger = Ledger()
    lab = POLICY.group("lab-b")
    tiers = [
        ledger.admit(POLICY, f"ns/p{i}", f"u{i}", lab, request("h200", 1)).tier for i in range(6)
    ]
    assert tiers == [IN_QUOTA] * 4 + [OVER_QUOTA] * 2
    seventh = ledger.admit(POLICY, "ns/p7", "u7", lab, request("h200", 1))
    assert seventh.outcome == "wait"  # when_full: wait
    # waiting: the numbers alone (the spawn page adds its place in line)
    assert seventh.reason == "lab-b already uses 6 of its 6 GPUs, and this server needs 1"
    assert "ns/p7" not in ledger.charges


def test_parent_caps_the_sum_of_its_children():
    ledger = Ledger()
    for i in range(5):
        assert ledger.admit(
            POLICY, f"ns/b{i}", f"b{i}", POLICY.group("lab-b"), request("mig", 1)
        ).admitted
    # dept: 5 x 3/7 = 2.14 used; lab-a adds whole GPUs until dept's 6 h200 devices are used
    for i in range(3):
        assert ledger.admit(
            POLICY, f"ns/a{i}", f"a{i}", POLICY.group("lab-a"), request("h200", 1)
        ).admitted
    assert ledger.usage("dept").gpus == Fraction(15, 7) + 3


def test_per_user_cap_refuses_with_the_numbers_and_what_to_stop():
    ledger = Ledger()
    lab = POLICY.group("lab-a")
    assert ledger.admit(POLICY, "ns/1", "ann", lab, request("shared", 1)).admitted
    assert ledger.admit(POLICY, "ns/2", "ann", lab, request("shared", 1)).admitted
    third = ledger.admit(POLICY, "ns/3", "ann", lab, request("shared", 1))
    assert third.outcome == "refuse"
    assert third.reason == (
        "you already run 2 of the 2 servers lab-a allows each member: stop one of them first"
    )
    one = parse_policy(
        flavors={"h200": {"kind": "gpu"}},
        profiles={"p": {"gpu": {"flavor": "h200"}}},
        groups={
            "lab": {
                "display_name": "Lab",
                "quota": {"gpus": 4},
                "per_user": {"servers": 1},
                "profiles": ["p"],
            }
        },
    )
    ledger = Ledger()
    assert ledger.admit(one, "ns/1", "ann", one.group("lab"), request("h200", 1)).admitted
    second = ledger.admit(one, "ns/2", "ann", one.group("lab"), request("h200", 1))
    assert (
        second.reason == "you already run your one Lab server: stop it first, then start this one"
    )


def test_a_request_larger_than_the_limit_is_refused_even_when_waiting_is_on():
    decision = Ledger().decide(POLICY, "u", POLICY.group("lab-b"), request("h200", 7))
    assert decision.outcome == "refuse"
    assert decision.reason == (
        "this server needs 7 GPUs, and lab-b may use at most 6 in all: choose a smaller "
        "profile or fewer GPUs"
    )


def test_releasing_frees_exactly_what_was_charged():
    ledger = Ledger()
    lab = POLICY.group("lab-a")
    ledger.admit(POLICY, "ns/1", "ann", lab, request("shared", 3, cpu=1500))
    ledger.release(POLICY, "ns/1")
    assert ledger.groups == {}
    assert ledger.users == {}
    assert ledger.charges == {}
    assert ledger.release(POLICY, "ns/never") is None


def test_resync_releases_vanished_pods_counts_unknown_ones_and_keeps_starting_spawns():
    ledger = Ledger()
    lab = POLICY.group("lab-a")
    ledger.admit(POLICY, "ns/gone", "ann", lab, request("h200", 2))
    ledger.admit(POLICY, "ns/starting", "bob", lab, request("h200", 1))
    ledger.admit(POLICY, "ns/running", "cat", lab, request("h200", 1))
    running = ledger.charges["ns/running"]
    other_replica = Charge("ns/other", "dan", "lab-b", request("h200", 2), IN_QUOTA)
    added, released = ledger.resync(POLICY, [running, other_replica], keep={"ns/starting"})
    assert (added, released) == (["ns/other"], ["ns/gone"])
    assert ledger.usage("lab-a").gpus == 2  # starting + running
    assert ledger.usage("dept").gpus == 4  # the parent counts lab-b's pod too
    assert ledger.user_usage("ann", "lab-a").is_zero()
    # the same charges rebuilt from scratch give the same totals
    rebuilt = Ledger.from_charges(POLICY, ledger.charges.values())
    assert rebuilt.groups == ledger.groups


def test_resync_does_not_count_again_a_server_released_after_its_listing():
    # the listing was taken while the pod terminated; its stop released it since
    ledger = Ledger()
    lab = POLICY.group("lab-a")
    ledger.admit(POLICY, "ns/leaving", "ann", lab, request("h200", 1))
    listed = ledger.charges["ns/leaving"]
    ledger.release(POLICY, "ns/leaving")
    added, released = ledger.resync(POLICY, [listed], keep={"ns/leaving"})
    assert (added, released) == ([], [])
    assert ledger.usage("lab-a").is_zero()


caps = st.fixed_dictionaries(
    {},
    optional={
        "gpus": st.integers(0, 2),
        "cpu": st.sampled_from(["500m", "1", "4"]),
        "memory": st.sampled_from(["1Gi", "8Gi"]),
        "servers": st.integers(0, 2),
        "flavors": st.fixed_dictionaries({}, optional={"h200": st.integers(0, 2)}),
    },
)


@settings(max_examples=200, deadline=None)
@given(limit=caps, per_user=caps, parent_limit=caps)
def test_a_profile_is_offered_exactly_when_admission_could_ever_admit_it(
    limit, per_user, parent_limit
):
    """The profile list and admission ask one cap check: nothing offered is always
    refused, nothing refused on an empty cluster is offered."""
    policy = parse_policy(
        flavors={"h200": {"kind": "gpu"}},
        profiles={
            "gpu": {"cpu": 1, "memory": "2Gi", "gpu": {"flavor": "h200"}},
            "cpu": {"cpu": 1, "memory": "2Gi"},
        },
        groups={
            "dept": {"limit": parent_limit},
            "lab": {
                "parent": "dept",
                "quota": {"gpus": 0},
                "limit": limit,
                "per_user": per_user,
                "profiles": ["gpu", "cpu"],
            },
        },
    )
    offered = {o.profile.name for o in offers(policy, ["lab"]) if o.group.name == "lab"}
    for name in ("gpu", "cpu"):
        wanted = base_request(policy, policy.profiles[name])
        decision = Ledger().decide(policy, "u1", policy.groups["lab"], wanted)
        assert (name in offered) == decision.admitted, (name, decision.reason)


def test_a_group_allowed_no_servers_is_offered_nothing():
    policy = parse_policy(
        profiles={"cpu": {"cpu": 1, "memory": "2Gi"}},
        groups={
            "frozen": {"limit": {"servers": 0}, "profiles": ["cpu"]},
            "one-each": {"per_user": {"servers": 0}, "profiles": ["cpu"]},
        },
    )
    assert offers(policy, ["frozen", "one-each"]) == []


def test_a_groups_own_when_full_decides_for_its_members_and_its_subgroups():
    policy = parse_policy(
        flavors={"h200": {"kind": "gpu"}},
        profiles={"p": {"gpu": {"flavor": "h200"}}},
        groups={
            "uni": {"quota": {"gpus": 2}, "when_full": "wait"},
            "course": {"parent": "uni", "quota": {"gpus": 1}, "profiles": ["p"]},
            "exam": {
                "parent": "uni",
                "quota": {"gpus": 2},
                "profiles": ["p"],
                "when_full": "refuse",
            },
            "other": {"quota": {"gpus": 1}, "profiles": ["p"]},
        },
    )
    assert policy.when_full == "refuse"
    assert [policy.when_full_of(g) for g in ("uni", "course", "exam", "other")] == [
        "wait",
        "wait",  # its parent's
        "refuse",  # its own, though its parent waits
        "refuse",  # the policy's
    ]
    ledger = Ledger()
    one = Request(gpus=Fraction(1), cpu=0, memory=0, devices=(("h200", 1),))
    assert ledger.admit(policy, "ns/c1", "c1", policy.group("course"), one).admitted
    # course's own cap: its parent's setting makes it wait
    assert ledger.admit(policy, "ns/c2", "c2", policy.group("course"), one).outcome == "wait"
    assert ledger.admit(policy, "ns/e1", "e1", policy.group("exam"), one).admitted
    # uni's cap (2) is reached: exam's own setting refuses, course's inherited one waits
    refused = ledger.admit(policy, "ns/e2", "e2", policy.group("exam"), one)
    assert (refused.outcome, refused.level) == ("refuse", "uni")
    assert ledger.admit(policy, "ns/o1", "o1", policy.group("other"), one).admitted
    assert ledger.admit(policy, "ns/o2", "o2", policy.group("other"), one).outcome == "refuse"
