"""What a server opens and the data it mounts, as the policy says: checked with key
paths, offered per group and profile, chosen only among what is offered, shaped
into the pod. Pure: no cluster (the hub and cluster tests are in
test_interfaces_datasets_hub.py)."""

from __future__ import annotations

import pytest

from jupyterhub_gpu.config.values import values_setup_errors
from jupyterhub_gpu.core.admission import IN_QUOTA, Ledger
from jupyterhub_gpu.core.model import PolicyError, parse_policy
from jupyterhub_gpu.core.profiles import profile_entry
from jupyterhub_gpu.core.selection import Refused, offers, select
from jupyterhub_gpu.core.shaping import apply_to_pod, merge_settings, mount_collisions, shape

P = "hub.config.GPUPolicy"

INTERFACES = {
    "lab": {"display_name": "JupyterLab", "url": "/lab"},
    "vscode": {"display_name": "VS Code", "url": "/vscode/"},
    "rstudio": {"display_name": "RStudio", "url": "/rstudio/"},
}
DATASETS = {
    "imagenet": {
        "display_name": "ImageNet",
        "nfs": {"server": "nfs.example.edu", "path": "/export/imagenet"},
        "mount_path": "/data/imagenet",
        "read_only": True,
    },
    "scratch": {"claim": "research-scratch", "mount_path": "/data/scratch"},
    "course": {
        "csi": {"driver": "lustre.csi.hpe.com", "volume_attributes": {"fs": "course"}},
        "mount_path": "/data/course",
        "read_only": True,
    },
    "department": {
        "nfs": {"server": "nfs.example.edu", "path": "/dept"},
        "mount_path": "/data/dept",
    },
}


def policy(**changes):
    settings = {
        "flavors": {"h200": {"kind": "gpu"}},
        "profiles": {
            "gpu": {"cpu": "1", "memory": "1Gi", "gpu": {"flavor": "h200"}},
            "cpu": {"cpu": "1", "memory": "1Gi"},
            "rlab": {"cpu": "1", "memory": "1Gi", "interfaces": ["rstudio", "lab"]},
        },
        "everyone": {"profiles": ["cpu"]},
        "groups": {
            "department": {"quota": {"gpus": 8}, "datasets": ["department"]},
            "research": {
                "parent": "department",
                "quota": {"gpus": 4},
                "profiles": ["gpu", "cpu", "rlab"],
                "interfaces": ["lab", "vscode"],
                "datasets": ["imagenet", "scratch"],
            },
            "students": {"quota": {"gpus": 2}, "profiles": ["gpu"], "datasets": ["course"]},
        },
        "interfaces": INTERFACES,
        "datasets": DATASETS,
    }
    settings.update(changes)
    return parse_policy(**settings)


def errors(**changes) -> list[str]:
    with pytest.raises(PolicyError) as info:
        policy(**changes)
    return info.value.errors


def test_each_group_offers_its_interfaces_and_the_first_is_the_default():
    model = policy()
    by_slug = {
        o.slug: [i.name for i in o.interfaces] for o in offers(model, ["research", "students"])
    }
    # research names two; a profile's own list narrows it (rstudio is not research's)
    assert by_slug["research--gpu"] == ["lab", "vscode"]
    assert by_slug["research--rlab"] == ["lab"]
    # students and everyone name none: the policy's first interface
    assert by_slug["students--gpu"] == ["lab"]
    assert by_slug["everyone--cpu"] == ["lab"]


def test_the_chosen_interface_is_where_the_server_opens():
    model = policy()
    chosen = select(model, ["research"], {"profile": "research--gpu", "interface": "vscode"})
    assert chosen.interface.url == "/vscode/"
    assert chosen.user_options == {"profile": "research--gpu", "interface": "vscode"}
    pod_shape = shape(model, chosen, IN_QUOTA, username="ann")
    assert merge_settings({}, pod_shape)["default_url"] == "/vscode/"
    # nothing chosen: the first
    default = select(model, ["research"], {"profile": "research--gpu"})
    assert default.interface.name == "lab"
    assert "interface" not in default.user_options


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # a group's own interface list is the bound, whatever the policy has
        ({"profile": "research--gpu", "interface": "rstudio"}, "offered: lab, vscode"),
        ({"profile": "students--gpu", "interface": "vscode"}, "offered: lab"),
        ({"profile": "research--gpu", "interface": "/etc/passwd"}, "is not offered"),
    ],
)
def test_an_interface_the_group_does_not_offer_is_refused_with_the_allowed_ones(options, message):
    with pytest.raises(Refused, match=message):
        select(policy(), ["research", "students"], options)


def test_an_interface_of_the_wrong_type_is_malformed():
    with pytest.raises(Refused, match="interface: expected one of the form's choices"):
        select(policy(), ["research"], {"profile": "research--gpu", "interface": {"url": "/x"}})


def test_without_interfaces_the_chart_default_url_is_kept_and_the_option_is_unknown():
    model = policy(interfaces=None, profiles={"cpu": {}}, groups={"g": {"profiles": ["cpu"]}})
    chosen = select(model, ["g"], {"profile": "g--cpu"})
    assert chosen.interface is None
    assert "default_url" not in merge_settings({}, shape(model, chosen, IN_QUOTA, username="ann"))
    with pytest.raises(Refused, match="has no 'interface' option"):
        select(model, ["g"], {"profile": "g--cpu", "interface": "lab"})


def test_the_form_offers_the_interface_choice_only_where_there_is_one():
    model = policy()
    entries = {o.slug: profile_entry(model, Ledger(), o) for o in offers(model, ["research"])}
    choice = entries["research--gpu"]["profile_options"]["interface"]
    assert {k: v["display_name"] for k, v in choice["choices"].items()} == {
        "lab": "JupyterLab",
        "vscode": "VS Code",
    }
    assert [k for k, v in choice["choices"].items() if v["default"]] == ["lab"]
    assert "interface" not in entries["research--rlab"].get("profile_options", {})


def test_a_server_mounts_its_groups_and_parents_datasets_read_only_where_said():
    model = policy()
    chosen = select(model, ["research", "students"], {"profile": "research--gpu"})
    pod_shape = shape(model, chosen, IN_QUOTA, username="ann")
    volumes = {v["name"]: v for v in pod_shape.volumes}
    mounts = {m["name"]: m for m in pod_shape.volume_mounts}
    # the department's data (the parent's) and research's own; not the students' course
    assert sorted(volumes) == ["dataset-department", "dataset-imagenet", "dataset-scratch"]
    assert volumes["dataset-imagenet"]["nfs"] == {
        "server": "nfs.example.edu",
        "path": "/export/imagenet",
        "readOnly": True,
    }
    assert volumes["dataset-scratch"]["persistentVolumeClaim"] == {
        "claimName": "research-scratch",
        "readOnly": False,
    }
    assert mounts["dataset-imagenet"] == {
        "name": "dataset-imagenet",
        "mountPath": "/data/imagenet",
        "readOnly": True,
    }
    assert mounts["dataset-scratch"]["readOnly"] is False
    students = shape(
        model, select(model, ["students"], {"profile": "students--gpu"}), IN_QUOTA, username="bo"
    )
    assert [v["name"] for v in students.volumes] == ["dataset-course"]
    assert students.volumes[0]["csi"] == {
        "driver": "lustre.csi.hpe.com",
        "readOnly": True,
        "volumeAttributes": {"fs": "course"},
    }


def test_the_mounts_are_added_beside_the_charts_home_and_never_replace_it():
    model = policy()
    pod_shape = shape(
        model, select(model, ["research"], {"profile": "research--cpu"}), IN_QUOTA, username="ann"
    )
    home = {"name": "home", "persistentVolumeClaim": {"claimName": "claim-ann"}}
    pod = {
        "metadata": {},
        "spec": {
            "volumes": [home],
            "containers": [
                {
                    "name": "notebook",
                    "volumeMounts": [{"name": "home", "mountPath": "/home/jovyan"}],
                }
            ],
        },
    }
    apply_to_pod(pod, pod_shape)
    assert pod["spec"]["volumes"][0] == home
    assert [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]] == [
        "/home/jovyan",
        "/data/dept",
        "/data/imagenet",
        "/data/scratch",
    ]
    # the pod has copies: a site's modify_pod_hook changing one changes no other server
    pod["spec"]["volumes"][1]["nfs"]["path"] = "/elsewhere"
    assert pod_shape.volumes[0]["nfs"]["path"] == "/dept"


def test_a_dataset_on_the_homes_path_is_named_with_the_fix():
    model = policy(datasets={**DATASETS, "scratch": {"claim": "s", "mount_path": "/home/jovyan/"}})
    mounts = {"home": {"name": "home", "mountPath": "/home/jovyan"}}  # the chart's dict form
    (problem,) = mount_collisions(model.datasets_of("research"), [], mounts)
    assert problem == (
        "the dataset scratch would be mounted at /home/jovyan, where the volume 'home' "
        "already is: give the dataset another mount_path"
    )
    assert mount_collisions(model.datasets_of("research"), [], []) == []


def test_a_volume_of_the_same_name_is_a_collision():
    model = policy()
    (problem,) = mount_collisions(model.datasets_of("students"), [{"name": "dataset-course"}], [])
    assert "volume name 'dataset-course'" in problem


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"interfaces": {"lab": {"url": "lab"}}},
            f"{P}.interfaces.lab.url: expected a path on the user's server such as /lab or "
            "/vscode/, got 'lab'",
        ),
        (
            {"interfaces": {"x": {"url": "https://example.com/"}}},
            f"{P}.interfaces.x.url: expected a path on the user's server",
        ),
        ({"interfaces": {"x": {"url": "//evil/"}}}, f"{P}.interfaces.x.url: expected a path"),
        ({"interfaces": {"x": {"url": "/a/../b"}}}, f"{P}.interfaces.x.url: expected a path"),
        ({"interfaces": {"x": {}}}, f"{P}.interfaces.x.url: required"),
        ({"interfaces": {"x": {"url": "/x", "icon": 1}}}, f"{P}.interfaces.x.icon: unknown key"),
        (
            {"groups": {"g": {"interfaces": ["lab", "emacs"]}}},
            f"{P}.groups.g.interfaces[1]: no interface named 'emacs' (interfaces: lab, vscode, "
            "rstudio)",
        ),
        ({"groups": {"g": {"interfaces": "lab"}}}, f"{P}.groups.g.interfaces: expected a list"),
        ({"groups": {"g": {"interfaces": ["lab", "lab"]}}}, "'lab' is listed twice"),
        (
            {"interfaces": None, "groups": {"g": {"interfaces": ["lab"]}}},
            f"{P}.groups.g.interfaces[0]: no interface named 'lab' (interfaces: none defined: "
            "add GPUPolicy.interfaces)",
        ),
        (
            {"groups": {"g": {"profiles": ["rlab"], "interfaces": ["vscode"]}}},
            f"{P}.groups.g.interfaces: profile rlab opens rstudio, lab only, which the group "
            "does not offer (vscode)",
        ),
        (
            {"groups": {"g": {"datasets": ["imagenet", "nope"]}}},
            f"{P}.groups.g.datasets[1]: no dataset named 'nope' (datasets: imagenet, scratch, "
            "course, department)",
        ),
        (
            {"datasets": {"d": {"mount_path": "/data/d"}}},
            f"{P}.datasets.d: give exactly one of nfs: {{server, path}}, claim: "
            "<PersistentVolumeClaim name> or csi: {driver, volume_attributes} (got none)",
        ),
        (
            {"datasets": {"d": {"claim": "a", "nfs": {}, "mount_path": "/data/d"}}},
            "(got nfs, claim)",
        ),
        ({"datasets": {"d": {"claim": "a"}}}, f"{P}.datasets.d.mount_path: required"),
        (
            {"datasets": {"d": {"claim": "a", "mount_path": "data"}}},
            f"{P}.datasets.d.mount_path: expected an absolute path such as /data/d, got 'data'",
        ),
        (
            {"datasets": {"d": {"claim": "a", "mount_path": "/home"}}},
            f"{P}.datasets.d.mount_path: /home would hide the image's own files",
        ),
        (
            {"datasets": {"d": {"claim": "a", "mount_path": "/opt/conda/lib/data"}}},
            f"{P}.datasets.d.mount_path: /opt/conda/lib/data would hide the image's own files",
        ),
        (
            {"datasets": {"d": {"claim": "Not_A_Claim", "mount_path": "/data/d"}}},
            f"{P}.datasets.d.claim: not a PersistentVolumeClaim name: 'Not_A_Claim'",
        ),
        (
            {"datasets": {"d": {"nfs": {"server": "s"}, "mount_path": "/data/d"}}},
            f"{P}.datasets.d.nfs.path: required",
        ),
        (
            {"datasets": {"d": {"csi": {"volume_attributes": {}}, "mount_path": "/data/d"}}},
            f"{P}.datasets.d.csi.driver: required",
        ),
        (
            {"datasets": {"d": {"claim": "a", "mount_path": "/data/d", "read_only": "yes"}}},
            f"{P}.datasets.d.read_only: expected true or false, got 'yes'",
        ),
        (
            {
                "datasets": {
                    **DATASETS,
                    "other": {"claim": "o", "mount_path": "/data/dept/"},
                },
                "groups": {
                    "department": {"quota": {"gpus": 8}, "datasets": ["department"]},
                    "research": {"parent": "department", "datasets": ["other"]},
                },
            },
            f"{P}.groups.research.datasets: datasets department and other are both mounted at "
            "/data/dept",
        ),
    ],
)
def test_mistakes_are_named_with_their_key_path(changes, expected):
    found = errors(**changes)
    assert any(expected in error for error in found), found


def test_the_example_of_the_docs_is_valid():
    model = policy()
    assert [d.kind for d in model.datasets.values()] == ["nfs", "claim", "csi", "nfs"]
    assert model.datasets["scratch"].claim == "research-scratch"
    assert model.datasets["imagenet"].claim is None


def test_check_names_a_dataset_mounted_where_the_chart_mounts_a_volume():
    values = {
        "singleuser": {
            "storage": {
                "type": "static",
                "homeMountPath": "/home/user",
                "extraVolumeMounts": [{"name": "shm", "mountPath": "/data/shm"}],
            }
        },
        "hub": {
            "config": {
                "KubeSpawner": {"volume_mounts": {"10-a": {"name": "a", "mountPath": "/data/a/"}}},
                "GPUPolicy": {
                    "datasets": {
                        "home": {"claim": "h", "mount_path": "/home/user/"},
                        "shm": {"claim": "s", "mount_path": "/data/shm"},
                        "a": {"claim": "s", "mount_path": "/data/a"},
                        # under the home, beside it or under the chart's mounts: fine
                        "inside": {"claim": "s", "mount_path": "/home/user/data"},
                        "beside": {"claim": "s", "mount_path": "/home/jovyan"},
                    }
                },
            }
        },
    }
    found = values_setup_errors(values)
    assert [e.split(":")[0] for e in found] == [
        f"{P}.datasets.home.mount_path",
        f"{P}.datasets.shm.mount_path",
        f"{P}.datasets.a.mount_path",
    ]
    assert found[0] == (
        f"{P}.datasets.home.mount_path: /home/user/ is where singleuser.storage.homeMountPath "
        "mounts a volume into every server (Kubernetes refuses a pod with two volumes at one "
        "path): give the dataset another mount_path"
    )
    assert "singleuser.storage.extraVolumeMounts" in found[1]
    assert "hub.config.KubeSpawner.volume_mounts" in found[2]
    # without storage the chart's homes are not mounted: /home/jovyan is free
    values["singleuser"] = {"storage": {"type": "none"}}
    values["hub"]["config"]["GPUPolicy"]["datasets"] = {
        "h": {"claim": "h", "mount_path": "/home/jovyan"}
    }
    assert values_setup_errors(values) == []
    # the chart's default: a dynamic home at /home/jovyan
    values["singleuser"] = {}
    assert len(values_setup_errors(values)) == 1
