"""Configuration that would be silently ignored is an error, offline and at hub start.

A misspelt setting, a policy section under the wrong name, a site's own profile
list beside a policy, and extraConfig that only the hub would see each stop
``jupyterhub-gpu check`` and the hub with the key path and the fix.
"""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from traitlets.config import Config

from jupyterhub_gpu.config.hubconfig import check_policy
from jupyterhub_gpu.config.policy import GPUPolicy
from jupyterhub_gpu.hub.offline import offline_spawner
from jupyterhub_gpu.hub.spawner import GPUKubeSpawner, SpawnRefused
from jupyterhub_gpu_dev.localcluster.hub import LocalHub

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


def test_a_prometheus_url_that_is_not_a_url_is_an_error(tmp_path):
    values = {"hub": {"config": {"GPUPolicy": GOOD, "GPUService": {"prometheus_url": "prom:9090"}}}}
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    assert (
        "hub.config.GPUService.prometheus_url: expected the Prometheus server's http(s) URL, "
        "such as http://prometheus-server.monitoring or http://127.0.0.1:9090, got 'prom:9090'"
    ) in result.stderr


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
    assert "singleuser.profileList has 1 profile and hub.config.GPUPolicy is set" in result.stderr
    assert "remove singleuser.profileList (or set it to null)" in result.stderr
    # the chart's default (an empty list) and null are fine
    for empty in ([], None):
        values["singleuser"]["profileList"] = empty
        assert check(tmp_path, values).returncode == 0


def test_every_mistake_is_in_one_report(tmp_path):
    values = {
        "hub": {
            "config": {
                "GPUPolicy": {**GOOD, "when_ful": "wait"},
                "GPUService": {"reconcile_dry_rn": True},
            }
        }
    }
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    assert "hub.config.GPUPolicy.when_ful: unknown setting" in result.stderr
    assert "hub.config.GPUService.reconcile_dry_rn: unknown setting" in result.stderr


def test_a_profile_list_in_the_spawners_own_settings_beside_the_policy_is_an_error(tmp_path):
    # z2jh applies hub.config after singleuser.profileList: this is the list the spawner gets
    values = {
        "hub": {
            "config": {
                "GPUPolicy": GOOD,
                "KubeSpawner": {"profile_list": [{"display_name": "Old CPU", "slug": "cpu"}]},
            }
        }
    }
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    assert (
        "hub.config.KubeSpawner.profile_list has 1 profile and hub.config.GPUPolicy is set"
    ) in result.stderr
    assert "remove hub.config.KubeSpawner.profile_list (or set it to [])" in result.stderr
    # ...and an empty one there replaces the chart's list: the policy's profiles are offered
    values["hub"]["config"]["KubeSpawner"]["profile_list"] = []
    values["singleuser"] = {"profileList": [{"display_name": "Old CPU", "slug": "cpu"}]}
    assert check(tmp_path, values).returncode == 0


def test_a_profile_list_keyed_by_slug_beside_the_policy_is_an_error(tmp_path):
    # KubeSpawner 7.1 also takes the profile list as a mapping keyed by slug
    values = {
        "hub": {"config": {"GPUPolicy": GOOD}},
        "singleuser": {"profileList": {"cpu": {"display_name": "Old CPU"}}},
    }
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    assert "singleuser.profileList has 1 profile and hub.config.GPUPolicy is set" in result.stderr


def test_a_plain_config_with_the_spawner_class_itself_and_no_policy_does_not_start():
    # a plain jupyterhub_config.py may import the class rather than name it
    config = Config()
    config.JupyterHub.spawner_class = GPUKubeSpawner
    config.GpuPolicy.update(GOOD)
    config.GPUService.reconcile_dry_rn = True
    report = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        check_policy(config, stream=report)
    assert exited.value.code == 1
    assert "the hub will not start" in report.getvalue()
    assert (
        "hub.config: spawner_class is gpu-kubespawner but there is no GPUPolicy section, so "
        "nobody could start a server; did you mean hub.config.GpuPolicy -> GPUPolicy?"
    ) in report.getvalue()
    assert "hub.config.GPUService.reconcile_dry_rn: unknown setting" in report.getvalue()


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


def test_the_scheduler_may_be_named_alone_in_the_trait_as_in_the_model(tmp_path):
    by_name = GPUPolicy(**{**GOOD, "scheduler": "volcano"})
    assert by_name.scheduler == {"name": "volcano"}
    assert (
        by_name.model.scheduler
        == GPUPolicy(**{**GOOD, "scheduler": {"name": "volcano"}}).model.scheduler
    )

    result = check(tmp_path, {"hub": {"config": {"GPUPolicy": {**GOOD, "scheduler": "kueue"}}}})
    assert result.returncode == 0, result.stderr
    assert "scheduler kueue" in result.stdout

    result = check(tmp_path, {"hub": {"config": {"GPUPolicy": {**GOOD, "scheduler": "slurm"}}}})
    assert result.returncode == 1
    assert (
        "hub.config.GPUPolicy.scheduler.name: expected one of default, kai, volcano, kueue, "
        "got 'slurm'"
    ) in result.stderr


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
                "from jupyterhub_gpu.config.hubconfig import check_policy\ncheck_policy(c)\n",
            },
            "hub.config.KubeSpawner.profile_list has 1 profile and hub.config.GPUPolicy is set",
        ),
        (
            {
                "policy": GOOD,
                "extra_config": 'c.KubeSpawner.extra_resource_limits = {"nvidia.com/gpu": "1"}\n'
                "from jupyterhub_gpu.config.hubconfig import check_policy\ncheck_policy(c)\n",
            },
            "hub.config.KubeSpawner.extra_resource_limits.nvidia.com/gpu: a GPU resource in a "
            "setting every server gets",
        ),
        (
            {"policy": GOOD, "service_settings": {"reconcile_dry_rn": True}},
            "hub.config.GPUService.reconcile_dry_rn: unknown setting; did you mean "
            "reconcile_dry_run?",
        ),
        (
            {"policy": GOOD, "service_settings": {"prometheus_url": "prometheus.monitoring"}},
            "hub.config.GPUService.prometheus_url: expected the Prometheus server's http(s) URL",
        ),
    ],
)
async def test_the_hub_does_not_start_with_a_configuration_mistake(local_cluster, mistake, message):
    hub = LocalHub(local_cluster, **mistake)
    try:
        with pytest.raises(RuntimeError, match="the hub did not start") as caught:
            await asyncio.to_thread(hub.start)
    finally:
        # a hub that started after all must not outlive the test
        await asyncio.to_thread(hub.stop)
    assert message in str(caught.value)
    assert "the hub will not start" in str(caught.value)
    assert hub.process.returncode == 1


def test_a_callable_profile_list_beside_the_policy_stops_a_plain_config_at_start_up():
    # a plain jupyterhub_config.py (or extraConfig) may set a function as the list
    config = Config()
    config.JupyterHub.spawner_class = "gpu-kubespawner"
    config.GPUPolicy.update(GOOD)
    config.KubeSpawner.profile_list = lambda spawner: [{"display_name": "Old", "slug": "old"}]
    report = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        check_policy(config, stream=report)
    assert exited.value.code == 1
    assert (
        "hub.config.KubeSpawner.profile_list is a callable and hub.config.GPUPolicy is set"
    ) in report.getvalue()


async def test_a_callable_profile_list_the_check_did_not_see_fails_every_spawn_clearly(caplog):
    # set where the start-up check cannot see it (z2jh's extraConfig runs after it): the
    # form and every spawn say the setting conflicts, instead of a 403 for each profile
    config = Config()
    config.GPUPolicy.update(GOOD)
    config.KubeSpawner.profile_list = lambda spawner: [{"display_name": "Old", "slug": "old"}]
    spawner = offline_spawner(config, "ann", [])
    spawner.user_options = {"profile": "old"}
    with pytest.raises(SpawnRefused) as refused:
        await spawner.load_user_options()
    assert refused.value.status_code == 500
    assert "profile_list setting conflicts with its GPU policy" in str(refused.value)
    assert "c.KubeSpawner.profile_list is a callable" in caplog.text
    with pytest.raises(SpawnRefused, match="conflicts with its GPU policy"):
        await spawner.get_options_form()


async def test_a_hub_with_no_policy_says_the_policy_is_missing(caplog):
    spawner = offline_spawner(Config(), "ann", ["lab"])
    with pytest.raises(SpawnRefused) as refused:
        await spawner.load_user_options()
    assert refused.value.status_code == 500
    assert "no GPU policy is configured on this hub" in str(refused.value)
    assert "ask an admin to add you to a group" not in str(refused.value)
    assert "no GPU policy is configured (no hub.config.GPUPolicy" in caplog.text


def test_gpus_in_settings_every_server_gets_are_errors_with_their_key_paths(tmp_path):
    # GPUs belong to the policy: a site-wide GPU would reach every policy pod, a CPU
    # profile's included, and be charged nothing
    policy = {
        **GOOD,
        "flavors": {"shared": {"kind": "timeslice", "replicas": 4, "resource": "acme.com/vgpu"}},
    }
    values = {
        "singleuser": {
            "extraResource": {
                "limits": {"nvidia.com/gpu": "1", "example.com/fpga": "1"},
                "guarantees": {"acme.com/vgpu": "1"},
            },
            "extraContainerConfig": {"resources": {"requests": {"nvidia.com/mig-1g.5gb": 1}}},
            "extraPodConfig": {"resourceClaims": [{"name": "gpu"}]},
        },
        "hub": {"config": {"GPUPolicy": policy}},
    }
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    fix = "a GPU resource in a setting every server gets; with the GPU policy, GPUs belong"
    for path in (
        "singleuser.extraResource.limits.nvidia.com/gpu",
        "singleuser.extraResource.guarantees.acme.com/vgpu",  # the policy's own flavor
        "singleuser.extraContainerConfig.resources.requests.nvidia.com/mig-1g.5gb",
        "singleuser.extraPodConfig.resourceClaims",
    ):
        assert f"{path}: {fix}" in result.stderr
    # other extended resources are the site's to give
    assert "example.com/fpga" not in result.stderr
    del values["singleuser"]
    values["singleuser"] = {"extraResource": {"limits": {"example.com/fpga": "1"}}}
    assert check(tmp_path, values).returncode == 0


def test_a_namespace_per_user_beside_the_policy_is_an_error(tmp_path):
    values = {
        "hub": {"config": {"GPUPolicy": GOOD, "KubeSpawner": {"enable_user_namespaces": True}}}
    }
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    assert (
        "hub.config.KubeSpawner.enable_user_namespaces: a namespace per user is not supported "
        "with the GPU policy"
    ) in result.stderr
    assert "use GPUPolicy.namespace_per_group to keep groups apart" in result.stderr


def test_an_unknown_billing_time_zone_is_an_error(tmp_path):
    values = {
        "hub": {"config": {"GPUPolicy": GOOD, "GPUService": {"billing_timezone": "Europe/Berln"}}}
    }
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    assert (
        "hub.config.GPUService.billing_timezone: unknown time zone 'Europe/Berln'; use an IANA "
        "name such as Europe/Berlin or America/New_York"
    ) in result.stderr
    values["hub"]["config"]["GPUService"]["billing_timezone"] = "Europe/Berlin"
    assert check(tmp_path, values).returncode == 0


def test_the_hubs_start_up_log_warns_of_a_policy_that_cannot_do_what_it_says():
    """A valid policy whose memory quota leaves its GPUs out of reach, and an idle rule
    over whole GPUs without Prometheus: the hub starts, and its log says both with the
    fix, as ``jupyterhub-gpu check`` does."""
    config = Config()
    config.GPUPolicy.update(
        {
            "flavors": {"a100": {"kind": "gpu"}},
            "profiles": {"gpu": {"cpu": 4, "memory": "64Gi", "gpu": {"flavor": "a100"}}},
            "groups": {
                "lab": {
                    "profiles": ["gpu"],
                    "quota": {"gpus": 4, "memory": "128Gi"},
                    "idle": {"after": "1h"},
                }
            },
        }
    )
    report = io.StringIO()
    check_policy(config, stream=report)  # returns: the hub starts
    assert report.getvalue().splitlines() == [
        "jupyterhub-gpu: warning: hub.config.GPUPolicy.groups.lab.quota.memory: 128Gi leaves "
        "room for at most 2 of the group's guaranteed 4 GPUs (2 of its largest GPU servers "
        "fit: 1 GPU, 4 CPUs and 64Gi each); raise quota.memory to at least 256Gi, or give "
        "its GPU profiles less memory",
        "jupyterhub-gpu: warning: hub.config.GPUPolicy.groups.lab.idle: its a100 servers' GPU "
        "use is read from DCGM through Prometheus, but hub.config.GPUService.prometheus_url is "
        "not set, so they are judged by notebook activity alone: a training run in a "
        "terminal, which makes none, is stopped after 1h and the notice; set "
        "hub.config.GPUService.prometheus_url to the Prometheus that scrapes dcgm-exporter",
        "jupyterhub-gpu: GPU policy checked: 1 group, 1 profile, 1 flavor",
    ]
