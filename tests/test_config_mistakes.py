"""Configuration that would be silently ignored is an error, offline and at hub start.

A misspelt setting, a policy section under the wrong name, a site's own profile
list beside a policy, and extraConfig that only the hub would see each stop
``jupyterhub-gpu check`` and the hub with the key path and the fix.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jupyterhub_gpu.localcluster.hub import LocalHub
from jupyterhub_gpu.policy import GPUPolicy

ROOT = Path(__file__).resolve().parents[1]
GOOD = {
    "profiles": {"cpu": {"cpu": "100m", "memory": "128Mi"}},
    "groups": {"lab": {"profiles": ["cpu"]}},
}


def check(tmp_path: Path, values: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyterhub_gpu.cli",
            "check",
            str(ROOT / "helm-values" / "base.yaml"),
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_misspelt_policy_setting_is_an_error_with_the_likely_one(tmp_path):
    result = check(tmp_path, {"hub": {"config": {"GPUPolicy": {**GOOD, "when_ful": "wait"}}}})
    assert result.returncode == 1, result.stdout
    assert (
        "hub.config.GPUPolicy.when_ful: unknown setting; did you mean when_full?" in result.stderr
    )


def test_a_misspelt_service_setting_is_an_error(tmp_path):
    values = {"hub": {"config": {"GPUPolicy": GOOD, "GPUService": {"reconcile_dry_rn": True}}}}
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    assert "hub.config.GPUService.reconcile_dry_rn: unknown setting; did you mean " in result.stderr
    assert "reconcile_dry_run?" in result.stderr


def test_the_gpu_spawner_without_a_policy_section_names_the_likely_section(tmp_path):
    # base.yaml sets spawner_class: gpu-kubespawner
    result = check(tmp_path, {"hub": {"config": {"GPUPolicies": GOOD}}})
    assert result.returncode == 1, result.stdout
    assert (
        "hub.config: spawner_class is gpu-kubespawner but there is no GPUPolicy section, so "
        "nobody could start a server; did you mean hub.config.GPUPolicies -> GPUPolicy?"
    ) in result.stderr


def test_a_sites_own_profile_list_beside_the_policy_is_an_error(tmp_path):
    values = {
        "hub": {"config": {"GPUPolicy": GOOD}},
        "singleuser": {"profileList": [{"display_name": "Old CPU", "slug": "cpu"}]},
    }
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    assert "singleuser.profileList has 1 profiles and hub.config.GPUPolicy is set" in result.stderr
    assert "remove singleuser.profileList (or set it to null)" in result.stderr
    # the chart's default (an empty list) and null are fine
    for empty in ([], None):
        values["singleuser"]["profileList"] = empty
        assert check(tmp_path, values).returncode == 0


def test_extra_config_that_changes_the_policy_is_an_error(tmp_path):
    values = {
        "hub": {
            "config": {"GPUPolicy": GOOD},
            "extraConfig": {"gpu": 'c.GPUPolicy.when_full = "wait"\n'},
        }
    }
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    assert (
        "hub.extraConfig.gpu: sets GPUPolicy, which the GPU service cannot see (it reads "
        "hub.config.GPUPolicy): move the setting to hub.config.GPUPolicy"
    ) in result.stderr


def test_the_policy_model_follows_changed_settings():
    policy = GPUPolicy(**GOOD)
    assert list(policy.model.groups) == ["lab"]
    policy.groups = {"other": {"profiles": ["cpu"]}}
    assert list(policy.model.groups) == ["other"]


@pytest.mark.k8s
@pytest.mark.hub
@pytest.mark.parametrize(
    ("mistake", "message"),
    [
        (
            {"policy": {**GOOD, "when_ful": "wait"}},
            "hub.config.GPUPolicy.when_ful: unknown setting; did you mean when_full?",
        ),
        (
            {
                "policy": GOOD,
                "extra_config": 'c.KubeSpawner.profile_list = [{"display_name": "x"}]\n'
                "from jupyterhub_gpu.hubconfig import check_policy\ncheck_policy(c)\n",
            },
            "singleuser.profileList has 1 profiles and hub.config.GPUPolicy is set",
        ),
    ],
)
async def test_the_hub_does_not_start_with_a_configuration_mistake(local_cluster, mistake, message):
    hub = LocalHub(local_cluster, **mistake)
    with pytest.raises(RuntimeError, match="the hub did not start") as caught:
        await asyncio.to_thread(hub.start)
    assert message in str(caught.value)
    assert "the hub will not start" in str(caught.value)
    assert hub.process.returncode == 1
