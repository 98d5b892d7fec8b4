"""The pod runner: which pods run locally, how they are bound, and their lifecycle."""

from __future__ import annotations

import pytest

from jupyterhub_gpu.dev.localcluster import sockets
from jupyterhub_gpu.dev.localcluster.podrunner import (
    DEFAULT_ALLOWED,
    NotRunnable,
    bind_to_pod_ip,
    container_argv,
    termination_message,
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
