"""Directory groups to hub groups (jupyterhub_gpu.core.directory) and the policy's
``directory_groups`` key: only the groups the policy names become hub groups."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jupyterhub_gpu.core.directory import DirectoryGroup, directory_key, hub_groups
from jupyterhub_gpu.core.model import PREFIX, PolicyError, parse_policy

ROOT = Path(__file__).resolve().parents[1]
POLICY = parse_policy(
    profiles={"cpu": {"cpu": 1, "memory": "1Gi"}},
    everyone={"profiles": ["cpu"]},
    groups={
        "research": {"profiles": ["cpu"]},
        "nlp": {
            "profiles": ["cpu"],
            "directory_groups": ["/research/nlp", "cn=nlp-lab,ou=groups,dc=example,dc=edu"],
        },
        "students": {"profiles": ["cpu"], "directory_groups": ["students-2025", 5001]},
        "test": {"profiles": ["cpu"], "directory_groups": ["hpc-admins"]},
    },
)


def groups_of(*memberships: DirectoryGroup, all_groups: bool = False) -> tuple[str, ...]:
    return hub_groups(POLICY, memberships, all_groups=all_groups).groups


def test_a_group_without_directory_groups_takes_the_directory_group_of_its_name():
    assert groups_of(DirectoryGroup("research")) == ("research",)
    # names match exactly: another case is another group
    assert groups_of(DirectoryGroup("Research")) == ()


def test_a_directory_group_named_in_the_policy_by_dn_path_or_id_makes_a_member():
    dn = DirectoryGroup("nlp-lab", ("CN=nlp-lab, ou=groups, DC=example,dc=edu",))
    assert groups_of(dn) == ("nlp",)
    assert groups_of(DirectoryGroup("/research/nlp")) == ("nlp",)
    posix = DirectoryGroup("cohort", ("cn=cohort,ou=groups,dc=example,dc=edu", "5001"))
    assert groups_of(posix) == ("students",)


def test_groups_come_in_policy_order_each_once():
    memberships = [
        DirectoryGroup("hpc-admins"),
        DirectoryGroup("students-2025"),
        DirectoryGroup("research"),
        DirectoryGroup("cohort", ("5001",)),
    ]
    assert groups_of(*memberships) == ("research", "students", "test")


def test_directory_groups_the_policy_does_not_name_are_left_out():
    mapping = hub_groups(
        POLICY, [DirectoryGroup("research"), DirectoryGroup("all-staff-mailing-list")]
    )
    assert mapping.groups == ("research",)
    assert mapping.unnamed == ("all-staff-mailing-list",)


def test_a_directory_group_called_like_a_policy_group_that_names_others_grants_nothing():
    # `test` is made of hpc-admins; a directory group that is merely called `test`
    # (anyone's mailing list) must not give its members the admins' unlimited group
    assert groups_of(DirectoryGroup("test")) == ()
    assert groups_of(DirectoryGroup("test"), all_groups=True) == ()
    assert groups_of(DirectoryGroup("everyone"), all_groups=True) == ()
    mapping = hub_groups(POLICY, [DirectoryGroup("Test")], all_groups=True)
    assert mapping.withheld == ("Test",)


def test_all_groups_adds_the_unnamed_directory_groups_by_name():
    memberships = [DirectoryGroup("zeta-list"), DirectoryGroup("hpc-admins"), DirectoryGroup("a")]
    assert groups_of(*memberships, all_groups=True) == ("test", "a", "zeta-list")


def test_no_directory_groups_no_hub_groups():
    assert groups_of() == ()


def test_dns_compare_as_rfc_4514_reads_them_and_names_exactly():
    assert directory_key("CN=a , OU=g") == directory_key("cn=a,ou=g")
    assert directory_key(r"cn=a\2Cb,ou=g") == directory_key(r"cn=a\,b,ou=g")
    assert directory_key("cn=a,ou=g") != directory_key("cn=b,ou=g")
    assert directory_key("/Research/NLP") != directory_key("/research/nlp")
    assert directory_key("/Research/NLP", case_insensitive=True) == directory_key("/research/nlp")


@pytest.mark.parametrize(
    "squatter",
    [
        DirectoryGroup(" HPC-Admins "),
        DirectoryGroup("HPC-Admins"),
        DirectoryGroup("hpc-admins "),
        DirectoryGroup("hpc-admin\u017f"),  # long s: its Unicode case folding is "s"
        DirectoryGroup("hpc-admin\u017f", ("cn=hpc-admin\u017f,ou=groups,dc=example,dc=edu",)),
        DirectoryGroup("\u212apc-admins"),  # Kelvin sign: lower()s to "k"... and is no "h"
        # outside the group search base: known by its DN only
        DirectoryGroup("hpc-admins", ("cn=hpc-admins,ou=selfservice,o=elsewhere",), named=False),
    ],
    ids=repr,
)
def test_a_look_alike_directory_group_grants_nothing(squatter):
    # `test` is the admins' unlimited group, made of the directory group hpc-admins
    assert groups_of(squatter) == ()
    assert groups_of(squatter, all_groups=True) in ((), (squatter.name,))
    assert "test" not in groups_of(squatter, all_groups=True)


def test_the_opt_in_for_case_insensitive_providers_folds_a_to_z_only():
    def folded(*memberships: DirectoryGroup) -> tuple[str, ...]:
        return hub_groups(POLICY, memberships, case_insensitive=True).groups

    assert folded(DirectoryGroup("HPC-Admins")) == ("test",)
    assert folded(DirectoryGroup("hpc-admin\u017f")) == ()
    assert folded(DirectoryGroup(" hpc-admins")) == ()
    assert folded(DirectoryGroup("hpc-admins")) == ("test",)


def test_a_group_known_by_its_dn_only_matches_its_dn():
    outside = DirectoryGroup("nlp-lab", ("cn=nlp-lab,ou=groups,dc=example,dc=edu",), named=False)
    assert groups_of(outside) == ("nlp",)
    assert groups_of(DirectoryGroup("research", ("cn=research,o=x",), named=False)) == ()
    # and is never added by its name
    assert groups_of(DirectoryGroup("zeta", ("cn=zeta,o=x",), named=False), all_groups=True) == ()


def test_directory_groups_are_read_as_text():
    assert POLICY.groups["students"].directory_groups == ("students-2025", "5001")
    assert POLICY.groups["research"].directory_groups == ()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("hpc-admins", "directory_groups: expected a list of directory group names"),
        (["ok", ""], "directory_groups[1]: expected a group name, DN, ID or path, got ''"),
        ([True], "directory_groups[0]: expected a group name, DN, ID or path, got True"),
        (["cn=a,,dc=edu"], "directory_groups[0]: 'cn=a,,dc=edu' is not a DN"),
        (["cn=a,example,dc=edu"], "directory_groups[0]: 'cn=a,example,dc=edu' is not a DN"),
        (["x", "x"], "directory_groups[1]: 'x' is listed twice"),
    ],
)
def test_a_bad_directory_groups_entry_is_an_error_with_its_key_path(raw, message):
    with pytest.raises(PolicyError) as raised:
        parse_policy(groups={"lab": {"directory_groups": raw}})
    assert f"{PREFIX}.groups.lab.{message}" in "\n".join(raised.value.errors)


def test_a_dn_with_an_escaped_comma_is_a_dn():
    policy = parse_policy(groups={"lab": {"directory_groups": [r"cn=Smith\, J.,ou=groups"]}})
    assert policy.groups["lab"].directory_groups == (r"cn=Smith\, J.,ou=groups",)


def test_everyone_has_no_directory_groups():
    with pytest.raises(PolicyError) as raised:
        parse_policy(everyone={"directory_groups": ["staff"]})
    assert raised.value.errors[0].startswith(f"{PREFIX}.everyone.directory_groups: unknown key")


def test_check_reports_a_bad_directory_group_with_its_key_path(tmp_path):
    values = {
        "hub": {
            "config": {
                "GPUPolicy": {
                    "profiles": {"cpu": {"cpu": 1, "memory": "1Gi"}},
                    "groups": {"lab": {"profiles": ["cpu"], "directory_groups": ["cn=x,,y"]}},
                }
            }
        }
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpu.cli", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 1, result.stdout
    assert (
        "hub.config.GPUPolicy.groups.lab.directory_groups[0]: 'cn=x,,y' is not a DN"
        in result.stderr
    )
