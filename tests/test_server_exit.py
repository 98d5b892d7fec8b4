"""A server whose process exits as it starts, on a real hub and the local cluster.

The pod runner really runs the single-user command; here it is given an option
jupyterhub-singleuser refuses, so the process exits with code 1 at once, as a server
with a bad command or a broken config in its home would. The spawn must fail at
once with the exit code and the end of the log (the kubelet's termination message,
which the pod runner fills as a kubelet does), never with a 500, and leave nothing
behind: no pod, no charge.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from hub_helpers import no_server, running_hub, wait_no_pods
from kube_helpers import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200", "node_selector": H200}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {
        # room for one server: a charge left behind would refuse the next
        "alpha": {"display_name": "Alpha Lab", "quota": {"gpus": 1}, "profiles": ["small"]},
    },
}
#: the option jupyterhub-singleuser refuses, and the line its log ends with
BAD_OPTION = "--ServerApp.port=not-a-port"
LOG_LINE = "The 'port' trait of a ServerApp instance expected an int, not the str 'not-a-port'"
HEADLINE = (
    "The server's process exited with code 1 at start. Fix what its log shows, or tell an "
    "admin if the image is at fault, then start it again. Last lines of its log:"
)


@pytest.fixture(scope="module")
async def exit_hub(local_cluster, core, priority_class_objects):
    async with running_hub(
        local_cluster,
        core,
        users={"ann": ["alpha"], "amy": ["alpha"]},
        policy=POLICY,
        extra_config=(
            f"c.KubeSpawner.cmd = ['jupyterhub-singleuser', {BAD_OPTION!r}]\n"
            # the REST answer waits for the spawn's end (a loaded machine is slow)
            "c.JupyterHub.tornado_settings = {'slow_spawn_timeout': 90}\n"
            "c.KubeSpawner.start_timeout = 150\n"
            "c.KubeSpawner.http_timeout = 120\n"
        ),
    ) as hub:
        yield hub


def read_progress(hub, user: str, events: list[dict], within: float = 120) -> None:
    """The spawn page's event stream for ``user``, as it comes, into ``events``; it is
    asked for until the spawn is pending."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            f"{hub.url}/hub/api/users/{user}/server/progress",
            headers={"Authorization": f"token {hub.api_token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=within) as stream:
                for raw in stream:
                    line = raw.decode().strip()
                    if line.startswith("data:"):
                        events.append(json.loads(line.removeprefix("data:")))
                return
        except urllib.error.HTTPError as e:
            if e.code not in (400, 404):  # no server, or not starting, yet
                raise
        time.sleep(0.1)


async def spawn(hub, user: str) -> tuple[int, dict]:
    """POST the user's server; the hub answers when the spawn ends (slow_spawn_timeout)."""
    path = f"/users/{user}/server"
    return await asyncio.to_thread(hub.api, "POST", path, {"profile": "alpha--small"}, None, 150)


async def test_a_server_that_exits_at_start_says_its_exit_code_and_log(exit_hub, core):
    events: list[dict] = []
    reader = threading.Thread(target=read_progress, args=(exit_hub, "ann", events), daemon=True)
    reader.start()
    started = time.monotonic()
    status, body = await spawn(exit_hub, "ann")
    took = time.monotonic() - started
    # a clear refusal, not JupyterHub's 500, and long before http_timeout
    assert status == 422, body
    assert took < 60, took
    message = body["message"]
    assert message.startswith(HEADLINE), message
    assert LOG_LINE in message
    assert len(message) < 2500

    # the spawn page's last event says the same, its log lines escaped in a block
    await asyncio.to_thread(reader.join, 60)
    failed = [e for e in events if e.get("failed")]
    assert failed, events
    assert failed[-1]["message"].startswith("Spawn failed: " + HEADLINE), failed
    assert LOG_LINE in failed[-1]["message"]
    html = failed[-1]["html_message"]
    assert "<pre" in html
    # the log's quotes are the server's text, shown as text
    assert "expected an int, not the str &#x27;not-a-port&#x27;" in html

    # nothing is left: no server, no pod, and no charge (alpha has room for one)
    await eventually(lambda: no_server(exit_hub, "ann"), "ann's server to be gone")
    await wait_no_pods(core, exit_hub.namespace)
    status, body = await spawn(exit_hub, "amy")
    assert status == 422, body
    assert body["message"].startswith(HEADLINE), body
    await eventually(lambda: no_server(exit_hub, "amy"), "amy's server to be gone")
    await wait_no_pods(core, exit_hub.namespace)
    log = exit_hub.log_path.read_text(errors="replace")
    assert "exited with code 1 at start" in log
