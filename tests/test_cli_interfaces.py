"""`jupyterhub-gpu profiles` and `pod` with interfaces and datasets, as an admin runs them.

What each profile opens and mounts, the spawn form's ``interface`` option in the
profile list, and the pod a spawn would create: the datasets' volumes and mounts
(read-only where said), the URL the server opens at (JupyterHub passes the
spawner's ``default_url`` as ``JUPYTERHUB_DEFAULT_URL``), and the refusals. The
reference clusters' datasets stay clear of the chart's home.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cli_helpers import cli
from jupyterhub_gpu.config.values import policy_from_values

VALUES = Path(__file__).parents[1] / "helm-values"
#: where z2jh mounts each user's home (singleuser.storage.homeMountPath's default)
CHART_HOME = "/home/jovyan"


def example(name: str) -> list[str]:
    return [str(VALUES / "base.yaml"), str(VALUES / f"{name}.yaml")]


def values_file(tmp_path: Path, policy: dict, **sections: dict) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"hub": {"config": {"GPUPolicy": policy, **sections}}}))
    return str(path)


def env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}


def by_profile(text: str) -> dict[str, list[str]]:
    """`profiles` output: each slug's indented lines."""
    sections: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith(" "):
            lines.append(line.strip())
        else:
            lines = sections[line.split(":", 1)[0]] = []
    return sections


def rendered(*args: str) -> dict:
    result = cli("pod", *args)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


INTERFACES = {
    "lab": {"display_name": "JupyterLab", "url": "/lab"},
    "vscode": {"display_name": "VS Code", "url": "/vscode/"},
}

#: one group of each kind of dataset, the CSI one inherited from a parent
POLICY = {
    "interfaces": INTERFACES,
    "datasets": {
        "imagenet": {
            "display_name": "ImageNet",
            "nfs": {"server": "nfs.example.org", "path": "/export/imagenet"},
            "mount_path": "/data/imagenet",
            "read_only": True,
        },
        "scratch": {
            "csi": {
                "driver": "nfs.csi.k8s.io",
                "volume_attributes": {"server": "nas.example.org", "share": "/scratch"},
            },
            "mount_path": "/data/scratch",
        },
    },
    "profiles": {"cpu": {"cpu": 1, "memory": "1Gi"}},
    "groups": {
        "dept": {"datasets": ["scratch"]},
        "lab": {
            "parent": "dept",
            "profiles": ["cpu"],
            "interfaces": ["lab", "vscode"],
            "datasets": ["imagenet"],
        },
    },
}


# ---- profiles ------------------------------------------------------------------------


def test_profiles_say_what_each_profile_opens_and_mounts():
    result = cli("profiles", *example("university"), "--groups", "research,students")
    assert result.returncode == 0, result.stderr
    sections = by_profile(result.stdout)
    assert list(sections) == [
        "research--research",
        "research--cpu",
        "students--student",
        "everyone--cpu",
    ]
    research = sections["research--research"]
    assert "opens: lab (JupyterLab, /lab; the default), vscode (VS Code, /vscode/)" in research
    assert (
        "mounts /data/datasets (read-only): Research datasets, from PersistentVolumeClaim "
        "research-datasets" in research
    )
    assert (
        "mounts /data/training: Training data, from PersistentVolumeClaim research-training"
        in research
    )
    # the opens line says the interface choice; it is not listed again as an option
    assert not any(line.startswith("interface:") for line in research)
    # the CPU profile's image has no code-server: JupyterLab only, in research too
    assert "opens: lab (JupyterLab, /lab)" in sections["research--cpu"]
    assert (
        "mounts /data/course (read-only): Course data, from NFS nfs.example.edu:/export/courses"
        in sections["students--student"]
    )
    assert sections["everyone--cpu"][-1] == "opens: lab (JupyterLab, /lab)"


def test_profiles_show_a_parents_csi_dataset_and_a_team_namespaces_claim(tmp_path):
    policy = {
        **POLICY,
        "namespace_per_group": True,
        "datasets": {
            **POLICY["datasets"],
            "results": {"claim": "lab-results", "mount_path": "/data/results"},
        },
        "groups": {
            **POLICY["groups"],
            "lab": {**POLICY["groups"]["lab"], "datasets": ["imagenet", "results"]},
        },
    }
    result = cli("profiles", values_file(tmp_path, policy), "--groups", "lab")
    assert result.returncode == 0, result.stderr
    mounts = [x for x in by_profile(result.stdout)["lab--cpu"] if x.startswith("mounts ")]
    # the parent's first, then the group's own
    assert mounts == [
        "mounts /data/scratch: scratch, from CSI driver nfs.csi.k8s.io "
        "(server=nas.example.org, share=/scratch)",
        "mounts /data/imagenet (read-only): ImageNet, from NFS nfs.example.org:/export/imagenet",
        "mounts /data/results: results, from PersistentVolumeClaim lab-results "
        "in namespace jupyterhub-gpu-lab",
    ]


def test_profiles_without_interfaces_say_the_chart_decides(tmp_path):
    policy = {k: v for k, v in POLICY.items() if k != "interfaces"}
    policy["groups"] = {"lab": {"profiles": ["cpu"]}}
    result = cli("profiles", values_file(tmp_path, policy), "--groups", "lab")
    assert result.returncode == 0, result.stderr
    assert (
        "    opens: the chart's singleuser.defaultUrl (GPUPolicy.interfaces is not set)\n"
        in result.stdout
    )
    assert "mounts" not in result.stdout


def test_profiles_json_offers_the_interface_only_where_there_is_a_choice():
    result = cli("profiles", *example("university"), "--groups", "research,students", "--json")
    assert result.returncode == 0, result.stderr
    entries = {e["slug"]: e for e in json.loads(result.stdout)}
    interface = entries["research--research"]["profile_options"]["interface"]
    assert interface["choices"] == {
        "lab": {"display_name": "JupyterLab", "default": True},
        "vscode": {"display_name": "VS Code", "default": False},
    }
    description = entries["research--research"]["description"]
    assert "data: Research datasets at /data/datasets (read-only)" in description
    # one interface: nothing to choose on the form
    assert "interface" not in entries["research--cpu"].get("profile_options", {})
    assert "profile_options" not in entries["students--student"]
    # the profile list carries no volumes: mounts come from the policy alone
    for entry in entries.values():
        assert not {"volumes", "volume_mounts"} & entry["kubespawner_override"].keys()


# ---- pod -----------------------------------------------------------------------------


def test_pod_mounts_the_groups_datasets_and_opens_the_chosen_interface(tmp_path):
    path = values_file(tmp_path, POLICY)
    pod = rendered(path, "--user", "ann", "--groups", "lab", "--option", "interface=vscode")
    spec = pod["spec"]
    assert spec["volumes"] == [
        {
            "name": "dataset-scratch",
            "csi": {
                "driver": "nfs.csi.k8s.io",
                "readOnly": False,
                "volumeAttributes": {"server": "nas.example.org", "share": "/scratch"},
            },
        },
        {
            "name": "dataset-imagenet",
            "nfs": {"server": "nfs.example.org", "path": "/export/imagenet", "readOnly": True},
        },
    ]
    assert spec["containers"][0]["volumeMounts"] == [
        {"name": "dataset-scratch", "mountPath": "/data/scratch", "readOnly": False},
        {"name": "dataset-imagenet", "mountPath": "/data/imagenet", "readOnly": True},
    ]
    assert env(pod)["JUPYTERHUB_DEFAULT_URL"] == "/vscode/"
    # without the option: the first interface the group offers
    pod = rendered(path, "--user", "ann", "--groups", "lab")
    assert env(pod)["JUPYTERHUB_DEFAULT_URL"] == "/lab"


def test_pod_keeps_the_sites_own_volumes_and_default_url_where_the_policy_is_silent(tmp_path):
    home = {"name": "home", "persistentVolumeClaim": {"claimName": "claim-{username}"}}
    site = {
        "KubeSpawner": {
            "default_url": "/tree",
            "volumes": [home],
            "volume_mounts": [{"name": "home", "mountPath": CHART_HOME}],
        }
    }
    policy = {k: v for k, v in POLICY.items() if k != "interfaces"}
    policy["groups"] = {**POLICY["groups"], "lab": {"parent": "dept", "profiles": ["cpu"]}}
    pod = rendered(values_file(tmp_path, policy, **site), "--user", "ann", "--groups", "lab")
    assert env(pod)["JUPYTERHUB_DEFAULT_URL"] == "/tree"
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["home", "dataset-scratch"]
    assert [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]] == [
        CHART_HOME,
        "/data/scratch",
    ]


def test_a_reference_teams_pod_mounts_its_parents_models_and_opens_vs_code():
    vscode = ["--option", "interface=vscode"]
    pod = rendered(*example("enterprise"), "--user", "ivy", "--groups", "interns", *vscode)
    assert pod["metadata"]["namespace"] == "nb-interns"
    (volume,) = pod["spec"]["volumes"]
    assert volume["name"] == "dataset-shared-models"
    assert volume["csi"]["driver"] == "nfs.csi.k8s.io"
    assert volume["csi"]["readOnly"] is True
    (mount,) = pod["spec"]["containers"][0]["volumeMounts"]
    assert mount == {"name": "dataset-shared-models", "mountPath": "/data/models", "readOnly": True}
    assert env(pod)["JUPYTERHUB_DEFAULT_URL"] == "/vscode/"


def test_pod_renders_a_claims_volume_and_names_the_claims_it_could_not_look_up():
    vscode = ["--option", "interface=vscode", "--hub-namespace", "jhub"]
    args = ["--user", "rita", "--groups", "research", "--profile", "research--research", *vscode]
    result = cli("pod", *example("university"), *args)
    assert result.returncode == 0, result.stderr
    pod = yaml.safe_load(result.stdout)
    assert pod["spec"]["volumes"] == [
        {
            "name": "dataset-research-datasets",
            "persistentVolumeClaim": {"claimName": "research-datasets", "readOnly": True},
        },
        {
            "name": "dataset-research-training",
            "persistentVolumeClaim": {"claimName": "research-training", "readOnly": False},
        },
    ]
    assert pod["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "dataset-research-datasets", "mountPath": "/data/datasets", "readOnly": True},
        {"name": "dataset-research-training", "mountPath": "/data/training", "readOnly": False},
    ]
    assert env(pod)["JUPYTERHUB_DEFAULT_URL"] == "/vscode/"
    assert pod["metadata"]["namespace"] == "jhub"
    assert pod["metadata"]["labels"]["gpu.jupyterhub.org/hub"] == "jhub"
    assert result.stderr == (
        "note: not checked offline: the PersistentVolumeClaim(s) research-datasets, "
        "research-training must exist in the hub's namespace; the hub refuses the spawn "
        "where one does not\n"
    )


def test_pod_without_the_releases_namespace_says_which_namespace_it_shows():
    args = ["--user", "sam", "--groups", "students"]
    result = cli("pod", *example("university"), *args)
    assert result.returncode == 0, result.stderr
    pod = yaml.safe_load(result.stdout)
    assert pod["metadata"]["labels"]["gpu.jupyterhub.org/hub"] == pod["metadata"]["namespace"]
    assert "pass --hub-namespace" in result.stderr
    shown = cli("pod", *example("university"), *args, "--hub-namespace", "jhub")
    assert shown.returncode == 0, shown.stderr
    assert "--hub-namespace" not in shown.stderr
    assert yaml.safe_load(shown.stdout)["metadata"]["labels"]["gpu.jupyterhub.org/hub"] == "jhub"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--groups", "students", "--option", "interface=vscode"],
            "refused: interface 'vscode' is not offered with students--student (offered: lab)",
        ),
        (
            ["--groups", "research", "--profile", "research--cpu", "--option", "volumes=x"],
            "refused: unknown option 'volumes': only the form's choices are accepted",
        ),
    ],
)
def test_pod_refuses_an_interface_not_offered_and_any_option_that_would_mount(args, message):
    result = cli("pod", *example("university"), "--user", "sam", *args)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_pod_refuses_a_dataset_mounted_over_the_home(tmp_path):
    site = {
        "KubeSpawner": {
            "volumes": [{"name": "home", "emptyDir": {}}],
            "volume_mounts": [{"name": "home", "mountPath": CHART_HOME}],
        }
    }
    policy = {
        **POLICY,
        "datasets": {
            **POLICY["datasets"],
            "imagenet": {**POLICY["datasets"]["imagenet"], "mount_path": CHART_HOME},
        },
    }
    result = cli("pod", values_file(tmp_path, policy, **site), "--user", "ann", "--groups", "lab")
    assert result.returncode == 1
    assert (
        f"the dataset imagenet would be mounted at {CHART_HOME}, where the volume 'home' "
        "already is" in result.stderr
    )


# ---- the reference clusters' values ---------------------------------------------------


@pytest.mark.parametrize("name", ["university", "department", "enterprise"])
def test_no_reference_dataset_is_mounted_on_or_over_the_home(name):
    policy = policy_from_values(example(name))
    for dataset in policy.datasets.values():
        path = dataset.mount_path.rstrip("/")
        assert not (path + "/").startswith(CHART_HOME + "/"), dataset.name
        assert not (CHART_HOME + "/").startswith(path + "/"), dataset.name
