"""The spawn form a user reads: KubeSpawner's own, and jupyterhub-fancy-profiles'.

Either form is handed the profile list as a user may read it: their own groups'
profiles and nothing of other groups, and no ``kubespawner_override``, whose
environment, volumes and pod config are the admin's (fancy-profiles puts the
whole list into the page as JSON). The overrides still reach the pod, and the
options a user submits are handled without JupyterHub's "unhandled" warning.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from jupyterhub_fancy_profiles import setup_ui
from traitlets.config import Config

from browser import log_in
from jupyterhub_gpu.offline import offline_spawner
from kube_helpers import eventually

#: what an admin puts in a profile's override and no user may read
LICENSE_TOKEN = "lic-7f3a9c-do-not-show"
POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200"}},
    "profiles": {
        "small": {
            "display_name": "Small GPU",
            "cpu": "100m",
            "memory": "128Mi",
            "gpu": {"flavor": "h200"},
            "kubespawner_override": {"environment": {"LICENSE_TOKEN": LICENSE_TOKEN}},
        },
        "cpu": {"display_name": "CPU only", "cpu": "100m", "memory": "128Mi"},
    },
    "everyone": {"profiles": ["cpu"]},
    "groups": {
        "lab": {"quota": {"gpus": 4}, "profiles": ["small"]},
        "hidden-team": {"display_name": "Hidden team", "quota": {"gpus": 4}, "profiles": ["small"]},
    },
}
FANCY_PROFILE_LIST = re.compile(r"window\.profileList = (.*);")


def keys_anywhere(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys_anywhere(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys_anywhere(v)}
    return set()


def config(fancy: bool) -> Config:
    c = Config()
    c.GPUPolicy.update(POLICY)
    if fancy:
        setup_ui(c)  # as an admin enables it, through c.KubeSpawner
    return c


@pytest.mark.parametrize("fancy", [False, True], ids=["kubespawner-form", "fancy-profiles"])
async def test_the_form_shows_the_users_profiles_and_no_overrides(fancy):
    spawner = offline_spawner(config(fancy), "ann", ["lab"])
    form = await spawner.get_options_form()

    assert "lab: Small GPU" in form
    assert "Everyone: CPU only" in form
    assert "Hidden team" not in form
    assert "hidden-team" not in form
    assert LICENSE_TOKEN not in form
    assert "LICENSE_TOKEN" not in form
    if fancy:
        (listed,) = FANCY_PROFILE_LIST.findall(form)
        profiles = json.loads(listed)
        assert [p["slug"] for p in profiles] == ["lab--small", "everyone--cpu"]
        assert "kubespawner_override" not in keys_anywhere(profiles)


async def test_the_override_the_form_hides_still_reaches_the_server():
    spawner = offline_spawner(config(fancy=True), "ann", ["lab"])
    spawner.user_options = {"profile": "lab--small"}
    await spawner.load_user_options()
    assert spawner.environment["LICENSE_TOKEN"] == LICENSE_TOKEN


async def test_an_admins_own_apply_user_options_hook_still_wins():
    c = config(fancy=False)

    def audit(spawner, user_options):
        """An admin's hook, e.g. recording what users asked for."""

    c.Spawner.apply_user_options = audit
    assert offline_spawner(c, "ann", ["lab"]).apply_user_options is audit


@pytest.mark.k8s
@pytest.mark.hub
async def test_fancy_profiles_page_spawns_the_chosen_group_profile(hub_factory, core, page):
    hub = await hub_factory(
        users={"ann": ["lab"]},
        policy=POLICY,
        extra_config="from jupyterhub_fancy_profiles import setup_ui\nsetup_ui(c)\n",
    )
    await log_in(page, hub.url, "ann", hub.password)
    # fancy-profiles' React form, not KubeSpawner's: it renders from window.profileList
    await page.wait_for_selector("#form >> text=lab: Small GPU", timeout=30_000)
    listed = await page.evaluate("window.profileList")
    assert [p["slug"] for p in listed] == ["lab--small", "everyone--cpu"]
    assert "kubespawner_override" not in keys_anywhere(listed)
    assert LICENSE_TOKEN not in await page.content()

    await page.click("#form >> text=lab: Small GPU")
    await page.click("button[type=submit]")

    async def gpu_pod():
        pods = (await core.list_namespaced_pod(hub.namespace)).items
        return pods[0] if pods else None

    pod = await eventually(gpu_pod, "ann's server pod")
    labels = pod.metadata.labels
    assert labels["gpu.jupyterhub.org/group"] == "lab"
    assert labels["gpu.jupyterhub.org/profile"] == "small"
    container = pod.spec.containers[0]
    assert container.resources.limits["nvidia.com/gpu"] == "1"
    env = {e.name: e.value for e in container.env}
    assert env["LICENSE_TOKEN"] == LICENSE_TOKEN
    # the options were handled: JupyterHub >= 5.3 would otherwise warn on every spawn
    assert "unhandled user_options" not in hub.log_path.read_text()
