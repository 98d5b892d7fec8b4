"""The policy's keys are declared once (``core.policy.keys`` and ``settings``), and the
parser, its unknown-key errors, ``GPUPolicy``'s traits and the reference all follow
that one table: a key declared there is read and checked, named in the errors, shown
in the help and the docs, and has the model's default."""

from __future__ import annotations

import copy
import runpy
from fractions import Fraction
from pathlib import Path

import pytest

from jupyterhub_gpu.core.model import (
    Budget,
    Egress,
    FairShare,
    Idle,
    Policy,
    PolicyError,
    Scheduler,
    parse_policy,
)
from jupyterhub_gpu.core.policy import keys
from jupyterhub_gpu.core.policy.reference import SECTIONS, reference_markdown, trait_help
from jupyterhub_gpu.core.policy.schema import Section
from jupyterhub_gpu.core.policy.settings import SETTINGS

P = "hub.config.GPUPolicy"
ROOT = Path(__file__).resolve().parents[2]

#: a policy that writes a mapping of every section, and is valid
FULL = {
    "scheduler": {"name": "kai"},
    "flavors": {
        "g": {"kind": "gpu"},
        "m": {"kind": "mig", "profile": "1g.5gb"},
        "ts": {"kind": "timeslice", "replicas": 4},
        "t": {"kind": "mps", "replicas": 2},
        "f": {"kind": "fraction", "gpu_fraction": 0.5},
        "fm": {"kind": "fraction", "gpu_memory": 20000},
        "h": {"kind": "hami", "gpu_memory": 1000},
        "d": {"kind": "dra"},
    },
    "profiles": {
        "p": {
            "gpu": {"flavor": "g"},
            "options": {
                "gpus": {"choices": [1, 2]},
                "image": {"choices": ["a"], "unlisted_choice": {"validation_regex": "a.*"}},
            },
        }
    },
    "interfaces": {"lab": {"url": "/lab"}},
    "datasets": {
        "n": {"nfs": {"server": "nfs.example.org", "path": "/x"}, "mount_path": "/data/n"},
        "c": {"claim": "pvc-a", "mount_path": "/data/c"},
        "s": {"csi": {"driver": "d"}, "mount_path": "/data/s"},
    },
    "everyone": {},
    "groups": {
        "a": {
            "profiles": ["p"],
            "quota": {"gpus": 2},
            "per_user": {"servers": 1},
            "budget": {"gpu_hours": 10, "period": "30d"},
            "idle": {"after": "2h"},
        }
    },
    "fair_share": {"half_life": "7d"},
    "namespace_per_group": True,
    "egress": {},
}
#: where a mapping of each section is in ``FULL``
PLACES: list[tuple[Section, tuple[str, ...]]] = [
    (keys.SCHEDULER, ("scheduler",)),
    *[
        (keys.FLAVOR + own, ("flavors", name))
        for name, own in zip(
            ["g", "m", "ts", "t", "f", "h", "d"], keys.FLAVOR_KINDS.values(), strict=True
        )
    ],
    (keys.PROFILE, ("profiles", "p")),
    (keys.GPU_REQUEST, ("profiles", "p", "gpu")),
    (keys.OPTIONS, ("profiles", "p", "options")),
    (keys.OPTION, ("profiles", "p", "options", "gpus")),
    (keys.UNLISTED_CHOICE, ("profiles", "p", "options", "image", "unlisted_choice")),
    (keys.INTERFACE, ("interfaces", "lab")),
    (keys.DATASET, ("datasets", "n")),
    (keys.NFS, ("datasets", "n", "nfs")),
    (keys.CSI, ("datasets", "s", "csi")),
    (keys.GROUP, ("groups", "a")),
    (keys.AMOUNTS, ("groups", "a", "quota")),
    (keys.PER_USER, ("groups", "a", "per_user")),
    (keys.BUDGET, ("groups", "a", "budget")),
    (keys.IDLE, ("groups", "a", "idle")),
    (keys.FAIR_SHARE, ("fair_share",)),
    (keys.EGRESS, ("egress",)),
]
#: where a key is only read beside the others it excludes
ELSEWHERE = {
    ("datasets", "n", "claim"): ("datasets", "c"),
    ("datasets", "n", "csi"): ("datasets", "s"),
    ("flavors", "f", "gpu_memory"): ("flavors", "fm"),
}
#: a value no key's type takes (a mapping whose value is a list)
WRONG = {"not": ["valid"]}


def _written(key_path: tuple[str, ...], value) -> dict:
    policy = copy.deepcopy(FULL)
    mapping = policy
    for part in key_path[:-1]:
        mapping = mapping[part]
    mapping[key_path[-1]] = value
    return policy


def _errors(policy: dict) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(**policy)
    return info.value.errors


def test_the_full_policy_is_valid():
    assert isinstance(parse_policy(**FULL), Policy)


def test_every_key_in_the_table_is_read_and_checked():
    """A key declared but never read would be neither unknown nor checked: whatever
    was written there would be silently ignored."""
    checked = 0
    for inside, path in PLACES:
        for name in inside:
            where = ELSEWHERE.get((*path, name), path)
            value = WRONG
            if inside[name].type is keys.NAMES or (inside is keys.GPU_REQUEST and name == "flavor"):
                value = "nowhere"  # names of other parts of the policy
            elif name == "kubespawner_override":
                value = {"cpu_limit": 1}  # any mapping but of what the policy sets
            found = _errors(_written((*where, name), value))
            key_path = f"{P}.{'.'.join(where)}.{name}"
            assert any(e.startswith(key_path) for e in found), (key_path, found)
            checked += 1
    for name in SETTINGS:
        if name == "namespace_prefix":  # any text, empty included
            continue
        found = _errors(_written((name,), WRONG))
        assert any(e.startswith(f"{P}.{name}") for e in found), (name, found)
        checked += 1
    assert checked > 100


def test_the_unknown_key_errors_list_the_keys_of_the_table():
    everyone = keys.GROUP.names - keys.EVERYONE_EXCLUDES
    for inside, path in [*PLACES, (keys.GROUP, ("everyone",))]:
        found = _errors(_written((*path, "colour"), 1))
        key_path = f"{P}.{'.'.join(path)}.colour"
        if inside is keys.OPTIONS:
            assert f"{key_path}: unknown option (allowed: gpus, flavor, image)" in found
            continue
        # per_user's budget is read apart from its caps, which the error lists
        names = keys.AMOUNTS.names if inside is keys.PER_USER else inside.names
        allowed = ", ".join(sorted(everyone if path == ("everyone",) else names))
        assert f"{key_path}: unknown key (allowed here: {allowed})" in found, (key_path, found)


def test_parse_policy_takes_the_settings_of_the_table_and_no_other():
    assert parse_policy(**{name: SETTINGS[name].default for name in SETTINGS}) == parse_policy()
    with pytest.raises(TypeError, match="when_ful"):
        parse_policy(when_ful="wait")


def test_a_key_not_written_has_the_models_default():
    policy = parse_policy(**FULL)
    group = policy.groups["a"]
    assert group.budget == Budget(gpu_hours=Fraction(10), period=30 * 86400)
    assert group.idle == Idle(after=7200)
    assert policy.fair_share == FairShare(half_life=7 * 86400)
    assert policy.egress == Egress()
    unset = parse_policy()
    assert unset.scheduler == Scheduler()
    defaults = Policy(scheduler=Scheduler(), flavors={}, profiles={}, everyone=None, groups={})
    for name in ("when_full", "namespace_per_group", "namespace_prefix", "extra_labels"):
        assert getattr(unset, name) == getattr(defaults, name), name
    assert unset.adopted_servers_preemptible == defaults.adopted_servers_preemptible


def test_the_traits_take_their_defaults_and_help_from_the_table():
    from jupyterhub_gpu.config.policy import GPUPolicy

    policy = GPUPolicy()
    own = set(GPUPolicy.class_own_traits(config=True))
    assert set(SETTINGS) <= own
    assert own - set(SETTINGS) == {"accounting_url", "accounting_fail_open"}
    for name in SETTINGS:
        assert getattr(policy, name) == SETTINGS[name].default, name
        assert GPUPolicy.class_traits()[name].help == trait_help(name)
    # each key inside a setting is in its help, with its line
    help_text = GPUPolicy.class_get_help()
    for inside in SECTIONS["groups"]:
        for key in inside.keys.values():
            assert f"``{key.name}``" in help_text
    assert "GPU-equivalent-hours in each period" in GPUPolicy.class_traits()["groups"].help


def test_the_reference_shows_every_section_of_the_table():
    declared = {id(v) for v in vars(keys).values() if isinstance(v, Section)}
    declared |= {id(s) for s in keys.FLAVOR_KINDS.values()}
    shown = {id(s) for sections in SECTIONS.values() for s in sections}
    assert declared == shown
    text = reference_markdown()
    for name in SETTINGS:
        assert f"### `{name}`" in text
    for sections in SECTIONS.values():
        for inside in sections:
            for key in inside.keys.values():
                assert f"| `{key.name}` | {key.type.doc} |" in text


def test_the_docs_build_writes_the_reference_from_the_table():
    """docs/conf.py writes the policy's reference at build time; reference.md shows it."""
    generated = runpy.run_path(str(ROOT / "docs" / "conf.py"))["generated"]
    assert (generated / "policy-settings.md").read_text() == reference_markdown()
    assert "_generated/policy-settings.md" in (ROOT / "docs" / "reference.md").read_text()
