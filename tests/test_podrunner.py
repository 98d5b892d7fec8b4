"""The pod runner: which pods run locally, how they are bound, and their lifecycle."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid

import pytest

from jupyterhub_gpu_dev import codeserver
from jupyterhub_gpu_dev.localcluster import sockets
from jupyterhub_gpu_dev.localcluster.podrunner import (
    DEFAULT_ALLOWED,
    NotRunnable,
    bind_to_pod_ip,
    container_argv,
    link_mounts,
    local_mounts,
    termination_message,
    unlink_mounts,
)
from kube_helpers import eventually


def test_stacks_image_without_command_runs_singleuser_when_given_a_hub_token():
    argv = container_argv({}, {"JUPYTERHUB_API_TOKEN": "t"}, DEFAULT_ALLOWED)
    assert argv[0].endswith("/jupyterhub-singleuser")
    argv = container_argv({"command": ["start-notebook.py"]}, {}, DEFAULT_ALLOWED)
    assert argv[0].endswith("/jupyterhub-singleuser")


@pytest.mark.parametrize(
    ("container", "reason"),
    [
        ({}, "no command and no hub token"),
        ({"command": ["rm", "-rf", "/"]}, "not in the runner's allow-list"),
        ({"command": ["jupyter-labhub-missing"]}, "not in the runner's allow-list"),
    ],
)
def test_pods_the_runner_leaves_simulated(container, reason):
    with pytest.raises(NotRunnable, match=reason):
        container_argv(container, {}, DEFAULT_ALLOWED)


def test_server_binds_the_pod_ip_never_all_interfaces():
    argv, env = bind_to_pod_ip(
        ["/bin/jupyterhub-singleuser", "--ip=0.0.0.0", "--port=8888"],
        {"JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:8888/user/alice/"},
        "127.64.0.7",
    )
    assert argv == ["/bin/jupyterhub-singleuser", "--ip=127.64.0.7", "--port=8888"]
    assert env["JUPYTERHUB_SERVICE_URL"] == "http://127.64.0.7:8888/user/alice/"
    argv, _ = bind_to_pod_ip(["/bin/jupyter", "lab", "--ip", "0.0.0.0"], {}, "127.64.0.8")
    assert argv == ["/bin/jupyter", "lab", "--ip", "127.64.0.8"]


def test_listening_address_decoding_sees_our_own_socket():
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        mine = sockets.listening_addresses([os.getpid()])[os.getpid()]
    assert f"127.0.0.1:{port}" in mine
    assert sockets.is_loopback(f"127.0.0.1:{port}")
    assert not sockets.is_loopback("0.0.0.0:8888")


@pytest.mark.k8s
async def test_process_exit_marks_the_pod_failed(core, namespace, local_cluster):
    """A singleuser pod with no hub to talk to exits on its own: the pod reports it."""
    pod = {
        "metadata": {"name": "lonely"},
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": "quay.io/jupyter/base-notebook",
                    "command": ["jupyterhub-singleuser"],
                    # no hub at this address: the server exits with an error
                    "env": [
                        {"name": "JUPYTERHUB_API_URL", "value": "http://127.0.0.1:9/hub/api"},
                        {"name": "JUPYTERHUB_SERVICE_URL", "value": "http://0.0.0.0:8888/"},
                    ],
                }
            ],
            "restartPolicy": "Never",
        },
    }
    await core.create_namespaced_pod(namespace, pod)

    async def failed():
        p = await core.read_namespaced_pod("lonely", namespace)
        return p if p.status.phase == "Failed" else None

    finished = await eventually(failed, "the pod to be marked Failed", within=60)
    terminated = finished.status.container_statuses[0].state.terminated
    assert terminated.exit_code != 0
    assert terminated.reason == "Error"
    # the default policy (File): the runner writes no termination-log file, so no message
    assert terminated.message is None


@pytest.mark.k8s
async def test_a_failed_container_with_fallback_to_logs_reports_its_logs_end(
    core, namespace, local_cluster
):
    """As a kubelet does: FallbackToLogsOnError puts the end of the log in the status."""
    pod = {
        "metadata": {"name": "bad-option"},
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": "quay.io/jupyter/base-notebook",
                    "command": ["jupyterhub-singleuser", "--ServerApp.port=not-a-port"],
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "env": [{"name": "JUPYTERHUB_SERVICE_URL", "value": "http://0.0.0.0:8888/"}],
                }
            ],
            "restartPolicy": "Never",
        },
    }
    await core.create_namespaced_pod(namespace, pod)

    async def failed():
        p = await core.read_namespaced_pod("bad-option", namespace)
        return p if p.status.phase == "Failed" else None

    finished = await eventually(failed, "the pod to be marked Failed", within=60)
    terminated = finished.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 1
    assert "expected an int, not the str 'not-a-port'" in terminated.message.splitlines()[-1]
    assert len(terminated.message.encode()) <= 2048


def test_the_termination_message_is_the_logs_last_80_lines_and_2048_bytes():
    container = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    log = b"".join(b"line %d\n" % i for i in range(200))
    message = termination_message(container, 1, log)
    assert message.splitlines()[-1] == "line 199"
    assert len(message.splitlines()) == 80
    long = b"x" * 5000 + b"\nend"
    assert len(termination_message(container, 1, long).encode()) == 2048
    # a clean exit, or another policy: no message
    assert termination_message(container, 0, log) is None
    assert termination_message({}, 1, log) is None


# ---- volumes: what the server sees of its mounts ------------------------------------


def test_local_folders_are_linked_where_they_are_mounted_and_the_rest_stays_simulated():
    container = {
        "volumeMounts": [
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "dataset-imagenet", "mountPath": "/data/imagenet", "readOnly": True},
            {"name": "dataset-remote", "mountPath": "/data/remote"},
            {"name": "dataset-training", "mountPath": "/data/training", "subPath": "v2"},
            {"name": "dataset-pending", "mountPath": "/data/pending"},
            {"name": "cache", "mountPath": "/cache"},
            {"name": "escape", "mountPath": "/data/../../etc"},
        ]
    }
    volumes = [
        {"name": "scratch", "hostPath": {"path": "/srv/scratch"}},
        {"name": "dataset-imagenet", "nfs": {"server": "127.0.0.1", "path": "/srv/imagenet"}},
        {"name": "dataset-remote", "nfs": {"server": "nfs.example.edu", "path": "/export/x"}},
        {"name": "dataset-training", "persistentVolumeClaim": {"claimName": "training"}},
        {"name": "dataset-pending", "persistentVolumeClaim": {"claimName": "pending"}},
        {"name": "cache", "emptyDir": {}},
        {"name": "escape", "hostPath": {"path": "/srv/x"}},
    ]
    bound = {"training": {"nfs": {"server": "127.0.2.1", "path": "/srv/training"}}}
    assert local_mounts(container, volumes, bound) == [
        ("scratch", "/srv/scratch"),
        ("data/imagenet", "/srv/imagenet"),
        ("data/training", "/srv/training/v2"),
    ]


def test_links_stand_in_for_mounts_leave_the_users_files_alone_and_go_with_the_server(tmp_path):
    home, export = tmp_path / "home", tmp_path / "export"
    (export / "train").mkdir(parents=True)
    (home / "notes").mkdir(parents=True)
    (home / "notes" / "mine.txt").write_text("the user's own")
    links = link_mounts(
        home, [("data/imagenet", str(export)), ("notes", str(export)), ("d/e/f", str(export))]
    )
    assert links == [home / "data/imagenet", home / "d/e/f"]
    assert (home / "data/imagenet/train").is_dir()
    assert (home / "notes/mine.txt").read_text() == "the user's own"  # not replaced
    # the next start replaces its own earlier link (a runner killed outright leaves them)
    assert link_mounts(home, [("data/imagenet", str(export))]) == [home / "data/imagenet"]
    (home / "data" / "results.csv").write_text("the user's, beside the mount")
    unlink_mounts(home, links)
    assert sorted(p.name for p in home.iterdir()) == ["data", "notes"]
    assert [p.name for p in (home / "data").iterdir()] == ["results.csv"]
    assert (export / "train").is_dir()  # the data itself is untouched


def test_code_servers_offline_setup_keeps_the_users_own_settings(tmp_path):
    settings = tmp_path / ".local/share/code-server/User/settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"editor.fontSize": 18, "workbench.startupEditor": "welcome"}))
    env = codeserver.offline_setup(tmp_path)
    config = (tmp_path / ".config/code-server/config.yaml").read_text()
    assert env == {
        "CODE_SERVER_CONFIG": str(tmp_path / ".config/code-server/config.yaml"),
        "EXTENSIONS_GALLERY": "{}",
    }
    for line in (
        'bind-addr: "127.0.0.1:8080"',
        'auth: "none"',
        "disable-telemetry: true",
        "disable-update-check: true",
        f'user-data-dir: "{settings.parents[1]}"',
    ):
        assert line in config.splitlines(), config
    written = json.loads(settings.read_text())
    assert written["editor.fontSize"] == 18
    assert written["workbench.startupEditor"] == "welcome"  # the user's choice stays
    assert written["update.mode"] == "none"
    assert written["telemetry.telemetryLevel"] == "off"


def _user_pod(name: str, user: str, command: list[str], **spec) -> dict:
    return {
        "metadata": {"name": name, "annotations": {"hub.jupyter.org/username": user}},
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": "quay.io/jupyter/base-notebook",
                    "command": command,
                    **spec.pop("container", {}),
                }
            ],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            **spec,
        },
    }


@pytest.mark.k8s
async def test_the_server_sees_its_local_volumes_where_they_are_mounted(
    core, namespace, local_cluster, tmp_path
):
    """hostPath, a loopback NFS export and a claim bound to a hostPath volume: each
    is in the server's own file listing at its mount path; gone when the pod goes."""
    folders = {}
    for name in ("scratch", "imagenet", "training"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / f"{name}.txt").write_text(name)
    volume_name = f"pv-{namespace}"
    await core.create_persistent_volume(
        {
            "metadata": {"name": volume_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "hostPath": {"path": str(folders["training"])},
                "claimRef": {"namespace": namespace, "name": "training"},
            },
        }
    )
    try:
        await core.create_namespaced_persistent_volume_claim(
            namespace,
            {
                "metadata": {"name": "training"},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": volume_name,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )
        user = f"vol-{uuid.uuid4().hex[:6]}"
        pod = _user_pod(
            "volumes",
            user,
            [
                "jupyter",
                "server",
                "--ServerApp.token=t0ken",
                "--port=8888",
                "--ServerApp.port_retries=0",
            ],
            container={
                "volumeMounts": [
                    {"name": "scratch", "mountPath": "/scratch"},
                    {"name": "dataset-imagenet", "mountPath": "/data/imagenet", "readOnly": True},
                    {"name": "dataset-training", "mountPath": "/data/training"},
                    {"name": "dataset-remote", "mountPath": "/data/remote"},
                ]
            },
            volumes=[
                {"name": "scratch", "hostPath": {"path": str(folders["scratch"])}},
                {
                    "name": "dataset-imagenet",
                    "nfs": {
                        "server": "127.0.0.1",
                        "path": str(folders["imagenet"]),
                        "readOnly": True,
                    },
                },
                {"name": "dataset-training", "persistentVolumeClaim": {"claimName": "training"}},
                {
                    "name": "dataset-remote",
                    "nfs": {"server": "nfs.example.edu", "path": "/export/remote"},
                },
            ],
        )
        await core.create_namespaced_pod(namespace, pod)

        async def running():
            p = await core.read_namespaced_pod("volumes", namespace)
            return p if p.status.phase == "Running" and p.status.pod_ip else None

        ip = (await eventually(running, "the pod to run", within=60)).status.pod_ip

        def listing(path: str) -> list[str] | None:
            url = f"http://{ip}:8888/api/contents/{path}?token=t0ken"
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    return sorted(c["name"] for c in json.load(response)["content"])
            except OSError:
                return None  # not serving yet

        async def served():
            return await asyncio.to_thread(listing, "data")

        assert await eventually(served, "the server's listing of data/", within=60) == [
            "imagenet",
            "training",
        ]  # the remote export stays simulated
        for path, name in (
            ("scratch", "scratch"),
            ("data/imagenet", "imagenet"),
            ("data/training", "training"),
        ):
            assert await asyncio.to_thread(listing, path) == [f"{name}.txt"], path
        home = local_cluster.state.path / "pods" / "homes" / f"{namespace}_{user}"
        assert (home / "data" / "imagenet").is_symlink()

        await core.delete_namespaced_pod("volumes", namespace, grace_period_seconds=0)

        async def unlinked():
            return not (home / "data").exists() and not (home / "scratch").exists()

        await eventually(unlinked, "the links to go with the pod", within=60)
        assert (folders["imagenet"] / "imagenet.txt").read_text() == "imagenet"
    finally:
        await core.delete_persistent_volume(volume_name)


@pytest.mark.k8s
async def test_servers_find_code_server_on_path_with_the_offline_config(
    core, namespace, local_cluster
):
    """As in an image with VS Code: code-server on PATH (jupyter-vscode-proxy looks it
    up there), its offline config in the home, no marketplace."""
    bin_dir = await asyncio.to_thread(codeserver.ensure_code_server)
    user = f"cs-{uuid.uuid4().hex[:6]}"
    pod = _user_pod(
        "troubleshoot",
        user,
        ["jupyter", "troubleshoot"],
        # a service URL: the runner then adds no --ip to a command that takes none
        container={"env": [{"name": "JUPYTERHUB_SERVICE_URL", "value": "http://0.0.0.0:8888/"}]},
    )
    await core.create_namespaced_pod(namespace, pod)

    async def finished():
        p = await core.read_namespaced_pod("troubleshoot", namespace)
        return p if p.status.phase in ("Succeeded", "Failed") else None

    done = await eventually(finished, "jupyter troubleshoot to finish", within=60)
    assert done.status.phase == "Succeeded"
    workdir = local_cluster.state.path / "pods"
    key = f"{namespace}_troubleshoot_{done.metadata.uid}"
    output = (workdir / "logs" / f"{key}.log").read_text()
    path = output.split("$PATH:", 1)[1].split("\n\n", 1)[0].split()
    assert path[0] == str(bin_dir), output  # first, as an image's would be
    home = workdir / "homes" / f"{namespace}_{user}"
    config = home / ".config" / "code-server" / "config.yaml"
    assert 'bind-addr: "127.0.0.1:8080"' in config.read_text()
    settings = json.loads((home / ".local/share/code-server/User/settings.json").read_text())
    assert settings["telemetry.telemetryLevel"] == "off"
