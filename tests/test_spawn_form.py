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
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from jupyterhub_fancy_profiles import setup_ui
from traitlets.config import Config

from browser import log_in
from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.budgets import UsageRecord
from jupyterhub_gpu.hub.admission import SpawnAdmission
from jupyterhub_gpu.hub.offline import offline_spawner
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


#: lab's GPU-hours: 1 per 7 days, all used by an earlier server of ann's
BUDGETED = {
    **POLICY,
    "profiles": {**POLICY["profiles"], "small": {**POLICY["profiles"]["small"], "default": True}},
    "groups": {
        "lab": {
            "display_name": "Lab",
            "quota": {"gpus": 4},
            "profiles": ["small", "cpu"],
            "budget": {"gpu_hours": 1, "period": "7d"},
        }
    },
}


def used_up_record(now: float) -> UsageRecord:
    """ann's earlier server: 1 GPU for 1.5 hours, ended 2 hours ago."""
    return UsageRecord(
        uid="earlier-pod",
        key="jhub/jupyter-ann",
        user="ann",
        group="lab",
        profile="small",
        flavor="h200",
        gpus=1,
        started=now - 3.5 * 3600,
        last_seen=now - 2 * 3600,
        ended=now - 2 * 3600,
    )


@pytest.mark.parametrize("fancy", [False, True], ids=["kubespawner-form", "fancy-profiles"])
async def test_a_used_up_gpu_profile_is_disabled_with_when_and_the_first_usable_is_default(
    fancy,
):
    c = config(fancy)
    c.GPUPolicy.update(BUDGETED)
    admission = SpawnAdmission.empty_cluster()
    now = time.time()
    admission.usage.put(offline_spawner(c, "ann", ["lab"]).gpu_policy, used_up_record(now))
    spawner = offline_spawner(c, "ann", ["lab"], admission=admission)
    # the last server's options name the used-up profile
    spawner.user_options = {"profile": "lab--small"}
    listed = await spawner._gpu_profile_list(spawner)
    small, cpu = [e for e in listed if e["slug"].startswith("lab--")]
    # room returns once the earlier server's use has left the 7-day window
    when = datetime.fromtimestamp(now - 2 * 3600 + 7 * 86400, UTC)
    assert small["display_name"] == "Lab: Small GPU (GPU-hours used up)"
    shown = re.match(
        r"Not available until (\S+ \S+) UTC: its GPU-hours are used up", small["description"]
    )
    assert shown, small["description"]
    assert (
        abs(
            datetime.strptime(shown[1], "%Y-%m-%d %H:%M").replace(tzinfo=UTC) - when
        ).total_seconds()
        <= 60
    )
    assert (small["disabled"], small["default"]) == (True, False)
    # the policy's default is used up: the first usable profile is the default
    assert (cpu.get("disabled"), cpu["default"]) == (None, True)

    form = await spawner.get_options_form()
    assert spawner.user_options == {"profile": "lab--small"}  # JupyterHub's, kept
    assert '["lab--small"]' in form  # the entries the form's script disables
    if not fancy:
        checked = re.findall(r'id="profile-item-([^"]+)"\s+value="[^"]+"\s+checked', form)
        assert checked == ["lab--cpu"]
    # and a spawn of it is refused with the same numbers
    spawner.user_options = {"profile": "lab--small"}
    with pytest.raises(Exception, match=r"used 1\.5 of 1 GPU-hour in the last 7 days"):
        await spawner.load_user_options()


async def test_a_slug_cannot_close_the_forms_script():
    from jupyterhub_gpu.core.profiles import disabling_script

    script = disabling_script(["a</script><script>alert(1)//"])
    assert script.count("</script>") == 1
    assert disabling_script([]) == ""


@pytest.mark.k8s
@pytest.mark.hub
@pytest.mark.parametrize("fancy", [False, True], ids=["kubespawner-form", "fancy-profiles"])
async def test_the_used_up_profile_cannot_be_chosen_in_the_browser(
    hub_factory, page, fancy, tmp_path
):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    UsageStore(url).open([used_up_record(time.time())])
    hub = await hub_factory(
        users={"ann": ["lab"]},
        policy=BUDGETED,
        extra_config=f"c.GPUPolicy.accounting_url = {url!r}\n"
        + ("from jupyterhub_fancy_profiles import setup_ui\nsetup_ui(c)\n" if fancy else ""),
    )
    await log_in(page, hub.url, "ann", hub.password)
    used_up = "#profile-option-lab--small" if fancy else "#profile-item-lab--small"
    usable = "#profile-option-lab--cpu" if fancy else "#profile-item-lab--cpu"
    await page.wait_for_selector(used_up, state="attached", timeout=30_000)
    assert await page.is_disabled(used_up)
    assert not await page.is_checked(used_up)
    assert await page.is_checked(usable)
    # clicking it changes nothing: the card or label takes no clicks
    card = "#profile-lab--small" if fancy else 'label[for="profile-item-lab--small"]'
    await page.click(card, force=True)
    assert not await page.is_checked(used_up)
    assert await page.is_checked(usable)
    assert "Not available until" in await page.inner_text(card)
