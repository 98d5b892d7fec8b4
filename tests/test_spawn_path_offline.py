"""The spawn path's pure parts, through the real spawner code in-process.

Offers, server-side validation and pod shape for every GPU kind and scheduler;
what the reference clusters offer and give each kind of member; the CLI.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml
from traitlets.config import Config

import matrix
from cli_helpers import cli
from jupyterhub_gpu.config.values import policy_from_config
from jupyterhub_gpu.core.selection import Refused, offers, select
from jupyterhub_gpu.hub.offline import offered_profiles, render_pod
from jupyterhub_gpu.hub.spawner import SpawnRefused

VALUES = Path(__file__).parents[1] / "helm-values"


def example(name: str) -> list[str]:
    """A reference cluster's values as deployed: the z2jh base file, then its own."""
    return [str(VALUES / "base.yaml"), str(VALUES / f"{name}.yaml")]


def values_file(tmp_path: Path, policy: dict) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"hub": {"config": {"GPUPolicy": policy}}}))
    return str(path)


def model(policy: dict):
    config = Config()
    config.GPUPolicy.update(policy)
    return policy_from_config(config)


CASES = [(s, k) for s in matrix.SCHEDULERS for k in matrix.kinds(s)]


@pytest.mark.parametrize(("scheduler", "kind"), CASES)
async def test_pod_shape_for_every_kind_and_scheduler(tmp_path, scheduler, kind):
    path = values_file(tmp_path, matrix.policy(scheduler))
    pod = await render_pod([path], "ann", ["lab"], f"lab--p-{kind}", {})
    matrix.assert_pod_matches(pod, kind, scheduler)
    charge = json.loads(pod["metadata"]["annotations"]["gpu.jupyterhub.org/charge"])
    assert charge["user"] == "ann"
    assert charge["request"]["devices"] == {kind: 1}


def test_user_sees_one_entry_per_group_and_profile_and_nothing_else():
    policy = model(
        yaml.safe_load((VALUES / "university.yaml").read_text())["hub"]["config"]["GPUPolicy"]
    )
    slugs = [o.slug for o in offers(policy, ["students", "some-idp-group"])]
    assert slugs == ["students--student", "everyone--cpu"]
    both = [o.slug for o in offers(policy, ["research", "students"])]
    assert both == ["research--research", "research--cpu", "students--student", "everyone--cpu"]
    assert [o.slug for o in offers(policy, [])] == ["everyone--cpu"]


def test_listed_profiles_leak_no_other_group():
    entries = offered_profiles(example("university"), ["students"])
    text = json.dumps(entries)
    assert "research" not in text.lower()
    assert "Test (admins)" not in text


def test_options_are_bounded_by_user_caps():
    policy = model(
        {
            "flavors": {"g": {"kind": "gpu"}},
            "profiles": {
                "p": {"gpu": {"flavor": "g"}, "options": {"gpus": {"choices": [1, 2, 4, 8]}}}
            },
            "groups": {"lab": {"quota": {"gpus": 16}, "per_user": {"gpus": 2}, "profiles": ["p"]}},
        }
    )
    (offer,) = [o for o in offers(policy, ["lab"]) if o.group.name == "lab"]
    assert [k for k, _ in offer.options["gpus"].choices] == ["1", "2"]
    with pytest.raises(Refused, match="gpus=4 is more than lab allows"):
        select(policy, ["lab"], {"profile": "lab--p", "gpus": "4"})
    assert select(policy, ["lab"], {"profile": "lab--p", "gpus": "2"}).request.gpus == 2


@pytest.mark.parametrize(
    ("groups", "options", "message"),
    [
        (
            ["students"],
            {"profile": "research--research"},
            "profile 'research--research' is not offered",
        ),
        (["research"], {"profile": "research--research", "gpus": "3"}, "gpus='3' is not a choice"),
        (
            ["research"],
            {"profile": "research--research", "flavor": "slice-32g"},
            "flavor='slice-32g'",
        ),
        (["research"], {"profile": "research--research", "cpu_guarantee": "64"}, "unknown option"),
        (["research"], {"profile": "research--cpu", "gpus": "1"}, "has no 'gpus' option"),
        (
            ["research"],
            {"profile": "research--research", "image--unlisted-choice": "evil"},
            "has no 'image--unlisted-choice' option",
        ),
    ],
)
def test_forged_or_out_of_bounds_options_are_refused(groups, options, message):
    policy = model(
        yaml.safe_load((VALUES / "university.yaml").read_text())["hub"]["config"]["GPUPolicy"]
    )
    with pytest.raises(Refused, match=message):
        select(policy, groups, options)


async def test_user_in_no_group_without_everyone_profiles_is_refused(tmp_path):
    path = values_file(tmp_path, {"groups": {"lab": {"profiles": []}}})
    with pytest.raises(SpawnRefused, match="you are not offered any server"):
        await render_pod([path], "nobody", [], None, {})


def test_zero_quota_offers_no_gpu_profile_and_refuses_it():
    policy = model(
        {
            "flavors": {"g": {"kind": "gpu"}},
            "profiles": {"p": {"gpu": {"flavor": "g"}}, "c": {}},
            "groups": {"frozen": {"quota": {"gpus": 0}, "profiles": ["p", "c"]}},
        }
    )
    assert [o.slug for o in offers(policy, ["frozen"])] == ["frozen--c"]
    with pytest.raises(Refused, match="not offered"):
        select(policy, ["frozen"], {"profile": "frozen--p"})


async def test_a_profiles_resources_are_what_the_server_gets_and_at_most_what_it_may_use(
    tmp_path,
):
    """Limits are the guarantees unless the profile raises them; a chart-wide limit
    (``singleuser.cpu.limit``) widens neither."""
    path = tmp_path / "values.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "singleuser": {"cpu": {"limit": 64}, "memory": {"limit": "256G"}},
                "hub": {
                    "config": {
                        "KubeSpawner": {"cpu_limit": 64, "mem_limit": "256G"},
                        "GPUPolicy": {
                            "profiles": {
                                "fixed": {"cpu": 4, "memory": "16Gi"},
                                "burst": {
                                    "cpu": 2,
                                    "memory": "4Gi",
                                    "cpu_limit": 8,
                                    "memory_limit": "32Gi",
                                },
                            },
                            "everyone": {"profiles": ["fixed", "burst"]},
                        },
                    }
                },
            }
        )
    )
    fixed = await render_pod([str(path)], "ann", [], "everyone--fixed", {})
    resources = fixed["spec"]["containers"][0]["resources"]
    # as KubeSpawner sends them: JSON numbers, which Kubernetes reads as quantities
    assert resources["requests"] == {"cpu": 4.0, "memory": 16 * 2**30}
    assert resources["limits"] == resources["requests"]

    burst = await render_pod([str(path)], "ann", [], "everyone--burst", {})
    resources = burst["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": 2.0, "memory": 4 * 2**30}
    assert resources["limits"] == {"cpu": 8.0, "memory": 32 * 2**30}


# ---- the three reference clusters --------------------------------------------------


async def test_university_student_gets_a_locked_32g_kai_slice():
    pod = await render_pod(example("university"), "sam", ["students"], None, {})
    container = pod["spec"]["containers"][0]
    assert pod["metadata"]["annotations"]["gpu-memory"] == "32000"
    assert pod["metadata"]["labels"]["kai.scheduler/queue"] == "students"
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert container["resources"]["requests"]["cpu"] == container["resources"]["limits"]["cpu"]
    assert "nvidia.com/gpu" not in container["resources"]["requests"]


async def test_university_researcher_picks_gpus_and_flavor():
    pod = await render_pod(
        example("university"),
        "rita",
        ["research"],
        "research--research",
        {"gpus": "4", "flavor": "h200"},
    )
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
    # per_user.gpus is 4: eight would be refused even though the option is offered to test
    with pytest.raises(SpawnRefused):
        await render_pod(
            example("university"),
            "rita",
            ["research"],
            "research--research",
            {"gpus": "8"},
        )


async def test_department_gpu_member_gets_runtime_class_and_chosen_image():
    pod = await render_pod(
        example("department"),
        "dana",
        ["cpsHPCAccess"],
        "cpsHPCAccess--gpu",
        {"gpus": "2", "image": "TensorFlow"},
    )
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert (
        pod["spec"]["containers"][0]["image"]
        == "registry.example.org/jupyter/tensorflow-gpu:cuda-2024-12-23"
    )
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "schedulerName" not in pod["spec"]


def test_department_everyone_gets_only_the_cpu_profile():
    entries = offered_profiles(example("department"), [])
    assert [e["slug"] for e in entries] == ["everyone--cpu"]
    assert "2 CPU, 2 GiB RAM" in entries[0]["description"]


async def test_enterprise_pod_lands_in_team_namespace_with_required_labels():
    pod = await render_pod(example("enterprise"), "eve", ["analytics"], None, {})
    labels = pod["metadata"]["labels"]
    assert pod["metadata"]["namespace"] == "nb-analytics"
    assert labels["team"] == "analytics"
    assert labels["user"] == "eve"
    assert labels["job_type"] == "notebook"
    assert labels["kueue.x-k8s.io/queue-name"] == "analytics"
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == resources["requests"]
    assert resources["limits"]["nvidia.com/gpu.shared"] == "1"


@pytest.mark.parametrize(
    ("name", "groups", "slugs"),
    [
        ("university", ["research"], ["research--research", "research--cpu", "everyone--cpu"]),
        ("university", ["students"], ["students--student", "everyone--cpu"]),
        (
            "university",
            ["test"],
            ["test--research", "test--student", "test--cpu", "everyone--cpu"],
        ),
        ("university", [], ["everyone--cpu"]),
        (
            "department",
            ["cpsHPCAccess"],
            ["cpsHPCAccess--gpu", "cpsHPCAccess--mig", "everyone--cpu"],
        ),
        (
            "department",
            ["jupyter_admin"],
            ["jupyter_admin--gpu", "jupyter_admin--mig", "jupyter_admin--cpu", "everyone--cpu"],
        ),
        ("department", ["some-other-idp-group"], ["everyone--cpu"]),
        (
            "enterprise",
            ["ml-research"],
            ["ml-research--full", "ml-research--dra", "ml-research--mig", "ml-research--light"],
        ),
        ("enterprise", ["analytics"], ["analytics--mig", "analytics--light"]),
        ("enterprise", ["interns"], ["interns--light"]),
        ("enterprise", ["platform"], []),
        ("enterprise", [], []),
    ],
)
def test_what_each_reference_group_is_offered(name, groups, slugs):
    entries = offered_profiles(example(name), groups)
    assert [e["slug"] for e in entries] == slugs


@pytest.mark.parametrize(
    ("name", "groups", "option", "choices"),
    [
        # per_user.gpus 4 bounds the research choices; the test queue is unlimited
        ("university", ["research"], "gpus", ["1", "2", "4"]),
        ("department", ["cpsHPCAccess"], "gpus", ["1", "2"]),
        ("department", ["cpsHPCAccess"], "image", ["PyTorch", "TensorFlow"]),
        # ml-research users may hold 8 GPUs each: every choice of the full profile fits
        ("enterprise", ["ml-research"], "gpus", ["1", "2", "4", "8"]),
    ],
)
def test_reference_options_are_bounded_by_group_and_user_caps(name, groups, option, choices):
    (entry, *_) = offered_profiles(example(name), groups)
    assert list(entry["profile_options"][option]["choices"]) == choices


async def test_enterprise_interns_get_one_light_slice_for_four_hours():
    pod = await render_pod(example("enterprise"), "ivy", ["interns"], None, {})
    assert pod["metadata"]["namespace"] == "nb-interns"
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "interns"
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == resources["requests"]
    assert resources["limits"]["nvidia.com/gpu.shared"] == "1"


async def test_department_member_without_gpu_group_cannot_forge_a_gpu_spawn():
    with pytest.raises(SpawnRefused, match="profile 'cpsHPCAccess--gpu' is not offered"):
        await render_pod(
            example("department"), "olga", ["some-other-idp-group"], "cpsHPCAccess--gpu", {}
        )


# ---- the command line --------------------------------------------------------------


@pytest.mark.parametrize(
    "files",
    [["university"], ["department"], ["enterprise"]]
    + [["base", n] for n in ("university", "department", "enterprise")],
    ids="+".join,
)
def test_check_passes_on_every_values_file(files):
    result = cli("check", *(str(VALUES / f"{n}.yaml") for n in files))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("policy OK")


def test_the_base_values_alone_are_no_deployment():
    # base.yaml plugs the spawner in; the policy comes from the cluster's own file
    result = cli("check", str(VALUES / "base.yaml"))
    assert result.returncode == 1
    assert "spawner_class is gpu-kubespawner but there is no GPUPolicy section" in result.stderr


def test_check_reports_errors_with_paths_and_exits_1(tmp_path):
    bad = values_file(tmp_path, {"groups": {"students": {"quota": {"gpus": "ten"}}}})
    result = cli("check", str(VALUES / "university.yaml"), bad)  # merged like helm -f
    assert result.returncode == 1
    assert (
        "hub.config.GPUPolicy.groups.students.quota.gpus: expected a number, got 'ten'"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_profiles_json_is_a_kubespawner_profile_list():
    result = cli("profiles", str(VALUES / "university.yaml"), "--groups", "research", "--json")
    profiles = json.loads(result.stdout)
    assert [p["slug"] for p in profiles] == ["research--research", "research--cpu", "everyone--cpu"]
    assert profiles[0]["profile_options"]["gpus"]["choices"].keys() == {"1", "2", "4"}


def test_pod_refusal_exits_1_with_the_reason():
    result = cli(
        "pod",
        str(VALUES / "university.yaml"),
        "--user",
        "x",
        "--groups",
        "students",
        "--profile",
        "research--research",
    )
    assert result.returncode == 1
    assert "refused: profile 'research--research' is not offered to you" in result.stderr


IMAGE_POLICY = {
    "profiles": {
        "cpu": {
            "cpu": 1,
            "memory": "1Gi",
            "image": "quay.io/jupyter/base-notebook:latest",
            "options": {
                "image": {
                    "choices": {"Base": "quay.io/jupyter/base-notebook:latest"},
                    "unlisted_choice": {"validation_regex": r"quay\.io/jupyter/[a-z-]+:[\w.-]+"},
                }
            },
        }
    },
    "everyone": {"profiles": ["cpu"]},
}


async def test_an_unlisted_image_that_matches_is_what_the_pod_runs(tmp_path):
    path = values_file(tmp_path, IMAGE_POLICY)
    image = "quay.io/jupyter/scipy-notebook:2026-11-01"
    pod = await render_pod([path], "ann", [], "everyone--cpu", {"image--unlisted-choice": image})
    assert pod["spec"]["containers"][0]["image"] == image
    (entry,) = offered_profiles([path], [])
    unlisted = entry["profile_options"]["image"]["unlisted_choice"]
    assert unlisted["enabled"] is True
    assert (
        unlisted["validation_regex"]
        == IMAGE_POLICY["profiles"]["cpu"]["options"]["image"]["unlisted_choice"][
            "validation_regex"
        ]
    )


@pytest.mark.parametrize(
    "image", ["docker.io/evil/miner:latest", "quay.io/jupyter/base-notebook:latest; rm -rf /"]
)
async def test_an_unlisted_image_that_does_not_match_is_refused(tmp_path, image):
    path = values_file(tmp_path, IMAGE_POLICY)
    with pytest.raises(SpawnRefused, match=f"image {re.escape(repr(image))} is not allowed here"):
        await render_pod([path], "ann", [], "everyone--cpu", {"image--unlisted-choice": image})


def test_offers_are_computed_once_per_policy_and_afresh_for_a_changed_one():
    policy = model(
        {
            "flavors": {"g": {"kind": "gpu"}},
            "profiles": {"p": {"gpu": {"flavor": "g"}, "options": {"gpus": {"choices": [1, 4]}}}},
            "groups": {"lab": {"quota": {"gpus": 4}, "profiles": ["p"]}},
        }
    )
    (first,) = offers(policy, ["lab"])
    assert offers(policy, ["lab"])[0] is first  # the same offer object: not recomputed
    assert [k for k, _ in first.options["gpus"].choices] == ["1", "4"]
    # a group's limit lowered: the changed policy's offers are its own
    lab = policy.groups["lab"]
    smaller = dataclasses.replace(lab, limit=dataclasses.replace(lab.limit, gpus=2))
    changed = dataclasses.replace(policy, groups={"lab": smaller})
    assert [k for k, _ in offers(changed, ["lab"])[0].options["gpus"].choices] == ["1"]
    assert [k for k, _ in offers(policy, ["lab"])[0].options["gpus"].choices] == ["1", "4"]


async def test_rendering_offline_leaves_the_process_and_the_hubs_admission_as_they_were():
    """``jupyterhub-gpu pod`` runs the real spawner, yet leaves nothing behind: not the
    process's Kubernetes configuration, not the ledger a hub in the process would use."""
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config import kube_config

    from jupyterhub_gpu.hub.spawner import GPUKubeSpawner

    location = kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    host = Configuration.get_default_copy().host
    hub_admission = GPUKubeSpawner._hub_admission
    pod = await render_pod(example("university"), "sam", ["students"], None, {})
    assert pod["metadata"]["labels"]["gpu.jupyterhub.org/group"] == "students"
    assert location == kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    assert Configuration.get_default_copy().host == host != "https://127.0.0.1:9"
    assert GPUKubeSpawner._hub_admission is hub_admission
