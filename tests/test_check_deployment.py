"""``jupyterhub-gpu check`` reads the whole deployment, as an admin runs it.

The hub's classes are resolved as JupyterHub resolves them and every
``hub.config.<Class>.<trait>`` is checked against the class's settings: a spawner
that would leave the policy unenforced, a misspelt class or setting, each is an
error with its key path and fix. A deployment that runs but not as its values
say (GPUs out of reach of the CPU or memory quota, an idle rule without its
metrics, fair share counting billed units that weigh nothing, a usage database a
restart loses) is a warning. Every shipped example
passes with neither.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from cli_helpers import ROOT, cli

VALUES = ROOT / "helm-values"
BASE = VALUES / "base.yaml"
UNIVERSITY = VALUES / "university.yaml"
EXAMPLES = ["university", "department", "enterprise"]
GOOD = {
    "profiles": {"cpu": {"cpu": "100m", "memory": "128Mi"}},
    "groups": {"lab": {"profiles": ["cpu"]}},
}


def check(tmp_path: Path, values: dict, *layers: Path) -> subprocess.CompletedProcess:
    """``jupyterhub-gpu check base.yaml [LAYERS...] values.yaml``."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return cli("check", str(BASE), *map(str, layers), str(path))


def warnings(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("warning: ")]


def config(**sections) -> dict:
    return {"hub": {"config": sections}}


# ---- the shipped examples ---------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_shipped_example_passes_check_with_no_error_and_no_warning(example):
    result = cli("check", str(BASE), str(VALUES / f"{example}.yaml"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("policy OK"), result.stdout
    assert warnings(result) == [], result.stderr


@pytest.mark.parametrize(
    ("example", "extra", "authenticator"),
    [("university", "ldap", "ldap-groups"), ("department", "oidc", "oidc-groups")],
)
def test_check_names_the_extra_the_hub_image_needs(example, extra, authenticator):
    result = cli("check", str(BASE), str(VALUES / f"{example}.yaml"))
    assert result.returncode == 0, result.stderr
    assert (
        f"the hub image needs the [{extra}] extra (authenticator_class: {authenticator}): "
        f"pip install 'jupyterhub-gpu[{extra}]'"
    ) in result.stdout


def test_an_authenticator_whose_extra_is_not_installed_says_which_extra():
    # check run where ldapauthenticator is not installed (a laptop without the extra)
    code = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class NotInstalled(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "ldapauthenticator":
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, NotInstalled())
        from jupyterhub_gpu.cli import main
        sys.exit(main(["check", {str(BASE)!r}, {str(UNIVERSITY)!r}]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert (
        "warning: hub.config.JupyterHub.authenticator_class: ldap-groups cannot be imported "
        "here (ModuleNotFoundError: No module named 'ldapauthenticator'): the hub image "
        "needs it (pip install 'jupyterhub-gpu[ldap]'); install it here too to have "
        "hub.config.LDAPGroupsAuthenticator checked"
    ) in result.stderr
    assert "pip install 'jupyterhub-gpu[ldap]'" in result.stdout


# ---- the hub's classes ------------------------------------------------------------


@pytest.mark.parametrize("spawner", ["kubespawner.KubeSpawner", "kubespawner"])
def test_a_spawner_that_does_not_enforce_the_policy_is_an_error(tmp_path, spawner):
    result = check(tmp_path, config(JupyterHub={"spawner_class": spawner}, GPUPolicy=GOOD))
    assert result.returncode == 1, result.stdout
    assert f"hub.config.JupyterHub.spawner_class: {spawner}" in result.stderr
    assert "gpu-kubespawner" in result.stderr
    if spawner == "kubespawner.KubeSpawner":
        assert (
            "hub.config.JupyterHub.spawner_class: kubespawner.KubeSpawner is KubeSpawner, which "
            "does not enforce hub.config.GPUPolicy: servers would start with none of its "
            "profiles, quotas or GPU checks; set spawner_class: gpu-kubespawner"
        ) in result.stderr
    # without a policy, KubeSpawner is a site's own choice
    values = config(JupyterHub={"spawner_class": "kubespawner.KubeSpawner"})
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(values))
    plain = cli("check", str(path))
    assert "spawner_class" not in plain.stderr


def test_a_misspelt_spawner_or_authenticator_names_the_likely_one(tmp_path):
    values = config(
        JupyterHub={"spawner_class": "gpu-kubespawer", "authenticator_class": "ldap-group"},
        GPUPolicy=GOOD,
    )
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    assert (
        "hub.config.JupyterHub.spawner_class: gpu-kubespawer: no installed spawner is called "
        "'gpu-kubespawer'; did you mean gpu-kubespawner? (the hub would not start)"
    ) in result.stderr
    assert (
        "hub.config.JupyterHub.authenticator_class: ldap-group: no installed authenticator "
        "is called 'ldap-group'; did you mean ldap-groups? (the hub would not start)"
    ) in result.stderr


def test_a_misspelt_setting_of_any_class_is_an_error_with_the_likely_one(tmp_path):
    values = config(
        GPUPolicy=GOOD,
        KubeSpawner={"start_timout": 600},
        GPUKubeSpawner={"queue_timout": 600},
        JupyterHub={"spawner_class": "gpu-kubespawner", "concurrent_spawn_limt": 20},
        Authenticator={"admin_user": ["root"]},
    )
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    for key, likely in [
        ("KubeSpawner.start_timout", "start_timeout"),
        ("GPUKubeSpawner.queue_timout", "queue_timeout"),
        ("JupyterHub.concurrent_spawn_limt", "concurrent_spawn_limit"),
        ("Authenticator.admin_user", "admin_users"),
    ]:
        section, trait = key.split(".")
        assert (
            f"hub.config.{key}: {section} has no setting {trait} (the hub would only log a "
            f"warning and keep the default); did you mean {likely}?"
        ) in result.stderr


def test_settings_reach_the_classes_traitlets_applies_them_to(tmp_path):
    # Spawner.namespace is KubeSpawner's, and traitlets applies Spawner's section to the
    # spawner the hub runs; queue_timeout under KubeSpawner reaches GPUKubeSpawner
    values = config(
        GPUPolicy=GOOD,
        Spawner={"start_timeout": 600, "namespace": "jhub"},
        KubeSpawner={"queue_timeout": 900},
    )
    result = check(tmp_path, values)
    assert result.returncode == 0, result.stderr
    assert warnings(result) == [], result.stderr


def test_a_section_naming_no_known_class_is_a_warning(tmp_path):
    values = config(GPUPolicy=GOOD, KubeSpawer={"start_timeout": 600}, SiteHook={"x": 1})
    result = check(tmp_path, values)
    assert result.returncode == 0, result.stderr
    assert warnings(result) == [
        "warning: hub.config.KubeSpawer: no class the hub loads here is called KubeSpawer, "
        "so its settings are not checked; did you mean hub.config.KubeSpawner?",
        "warning: hub.config.SiteHook: no class the hub loads here is called SiteHook, so "
        "its settings are not checked",
    ]


def test_every_mistake_of_the_classes_and_the_policy_is_in_one_report(tmp_path):
    values = config(
        JupyterHub={"spawner_class": "kubespawner.KubeSpawner"},
        GPUPolicy={**GOOD, "when_ful": "wait"},
        KubeSpawner={"start_timout": 600},
    )
    result = check(tmp_path, values)
    assert result.returncode == 1, result.stdout
    assert "the policy has 3 error(s)" in result.stderr
    assert "hub.config.GPUPolicy.when_ful: unknown setting" in result.stderr
    assert "hub.config.JupyterHub.spawner_class: kubespawner.KubeSpawner is" in result.stderr
    assert "hub.config.KubeSpawner.start_timout" in result.stderr


# ---- warnings: a deployment that would not do what it says ---------------------------


def test_a_memory_quota_that_leaves_the_gpus_out_of_reach_is_a_warning(tmp_path):
    # the university example as it was: each research server asks 64Gi, so 131Gi
    # holds two of them, 8 GPUs of the promised 12 (and of the burst to 24)
    values = config(
        GPUPolicy={
            "groups": {
                "research": {
                    "quota": {"gpus": 12, "cpu": 64, "memory": "131Gi"},
                    "limit": {"gpus": 24, "cpu": None, "memory": None},
                }
            }
        }
    )
    result = check(tmp_path, values, UNIVERSITY)
    assert result.returncode == 0, result.stderr
    assert warnings(result) == [
        "warning: hub.config.GPUPolicy.groups.research.quota.memory: 131Gi leaves room for at "
        "most 8 of the group's guaranteed 12 GPUs (2 of its largest GPU servers fit: 4 GPUs, "
        "8 CPUs and 64Gi each); raise quota.memory to at least 192Gi, or give its GPU "
        "profiles less memory",
        "warning: hub.config.GPUPolicy.groups.research.limit.memory: 131Gi (from "
        "quota.memory) leaves room for at most 8 of the group's burst limit of 24 GPUs (2 of "
        "its largest GPU servers fit: 4 GPUs, 8 CPUs and 64Gi each); raise limit.memory to "
        "at least 384Gi, or give its GPU profiles less memory",
    ]


def test_a_cpu_limit_that_leaves_the_burst_out_of_reach_is_a_warning(tmp_path):
    profiles = {"gpu": {"cpu": 8, "memory": "8Gi", "gpu": {"flavor": "a100", "count": 2}}}
    policy = {
        "flavors": {"a100": {"kind": "gpu"}},
        "profiles": profiles,
        "groups": {
            "lab": {
                "profiles": ["gpu"],
                "quota": {"gpus": 4, "cpu": 16},
                "limit": {"gpus": 8, "cpu": 24},
            }
        },
    }
    result = check(tmp_path, config(GPUPolicy=policy))
    assert result.returncode == 0, result.stderr
    assert warnings(result) == [
        "warning: hub.config.GPUPolicy.groups.lab.limit.cpu: 24 leaves room for at most 6 of "
        "the group's burst limit of 8 GPUs (3 of its largest GPU servers fit: 2 GPUs, 8 CPUs "
        "and 8Gi each); raise limit.cpu to at least 32, or give its GPU profiles fewer CPUs"
    ]
    # GPU counts that do not add up to the quota are not the CPU's fault: no warning
    policy["groups"]["lab"]["quota"] = {"gpus": 3}
    policy["groups"]["lab"]["limit"] = {"gpus": 3}
    assert warnings(check(tmp_path, config(GPUPolicy=policy))) == []


def test_an_idle_rule_over_whole_gpus_without_prometheus_is_a_warning(tmp_path):
    values = config(GPUService={"prometheus_url": None})  # null deletes the example's
    result = check(tmp_path, values, UNIVERSITY)
    assert result.returncode == 0, result.stderr
    assert warnings(result) == [
        "warning: hub.config.GPUPolicy.groups.research.idle: its h200 servers' GPU use is "
        "read from DCGM through Prometheus, but hub.config.GPUService.prometheus_url is not "
        "set, so they are judged by notebook activity alone: a training run in a terminal, "
        "which makes none, is stopped after 2h and the notice; set "
        "hub.config.GPUService.prometheus_url to the Prometheus that scrapes dcgm-exporter"
    ]
    # the students' idle rule is not named: a shared slice is judged by activity anyway


def test_fair_share_counting_billed_units_that_weigh_nothing_is_a_warning(tmp_path):
    fair = {"half_life": "7d", "count": "billed_units"}
    result = check(tmp_path, config(GPUPolicy={**GOOD, "fair_share": fair}))
    assert result.returncode == 0, result.stderr
    assert warnings(result) == [
        "warning: hub.config.GPUPolicy.fair_share.count: billed_units, but no flavor has a "
        "billing weight other than 1, so billed units are GPU-hours and the line is ordered "
        "as with gpu_hours; give the flavors their weights (flavors.<name>.billing: "
        "{weight: 3}), or remove count"
    ]
    weighted = {"a100": {"kind": "gpu", "billing": {"weight": 2}}}
    values = config(GPUPolicy={**GOOD, "fair_share": fair, "flavors": weighted})
    assert warnings(check(tmp_path, values)) == []


@pytest.mark.parametrize(
    ("values", "warned"),
    [
        (
            {"hub": {"db": {"type": "sqlite-memory"}}},
            "warning: hub.config.GPUPolicy.accounting_url: "
            "sqlite:///jupyterhub-gpu-usage.sqlite (the default) is a file in /srv/jupyterhub, "
            "which is on the hub's volume only with hub.db.type sqlite-pvc (here "
            "sqlite-memory): it is lost at every hub restart",
        ),
        (
            config(GPUPolicy={"accounting_url": "sqlite:///:memory:"}),
            "warning: hub.config.GPUPolicy.accounting_url: sqlite:///:memory: keeps the usage "
            "database in memory: it is lost at every hub restart",
        ),
        (
            config(GPUPolicy={"accounting_url": "sqlite:////var/lib/usage.sqlite"}),
            "warning: hub.config.GPUPolicy.accounting_url: sqlite:////var/lib/usage.sqlite is "
            "a file in the hub container, on no volume: it is lost at every hub restart",
        ),
        ({"hub": {"db": {"type": "sqlite-pvc"}}}, None),
        (config(GPUPolicy={"accounting_url": "postgresql://hub@db.example.org/hub"}), None),
        (
            {
                "hub": {
                    "extraVolumeMounts": [{"name": "usage", "mountPath": "/data/usage"}],
                    "config": {"GPUPolicy": {"accounting_url": "sqlite:////data/usage/u.db"}},
                }
            },
            None,
        ),
    ],
)
def test_a_usage_database_a_hub_restart_loses_is_a_warning(tmp_path, values, warned):
    result = check(tmp_path, values, UNIVERSITY)
    assert result.returncode == 0, result.stderr
    found = warnings(result)
    if warned is None:
        assert found == [], result.stderr
    else:
        (warning,) = found
        assert warning.startswith(warned), warning
        assert "point it at the hub's PostgreSQL" in warning


@pytest.mark.parametrize(
    ("values", "warned"),
    [
        ({}, True),
        ({"hub": {"allowNamedServers": True}}, False),
        (config(JupyterHub={"allow_named_servers": True}), False),
        # hub.config is applied after the chart's own setting, and wins
        (
            {
                "hub": {
                    "allowNamedServers": True,
                    **config(JupyterHub={"allow_named_servers": False})["hub"],
                }
            },
            True,
        ),
    ],
)
def test_a_per_user_server_cap_above_one_without_named_servers_is_a_warning(
    tmp_path, values, warned
):
    policy = {
        "profiles": {"cpu": {"cpu": "100m", "memory": "128Mi"}},
        "everyone": {"profiles": ["cpu"], "per_user": {"servers": 3}},
        "groups": {"lab": {"profiles": ["cpu"], "per_user": {"servers": 2}}, "one": {}},
    }
    layered = {**values, "hub": {**values.get("hub", {})}}
    layered["hub"]["config"] = {**layered["hub"].get("config", {}), "GPUPolicy": policy}
    result = check(tmp_path, layered)
    assert result.returncode == 0, result.stderr
    expected = [
        f"warning: hub.config.GPUPolicy.{where}.per_user.servers: {n}, but named servers are "
        "off, so JupyterHub gives each user one server and no member ever starts a second; "
        "set hub.config.JupyterHub.allow_named_servers: true, or per_user.servers: 1"
        for where, n in (("groups.lab", 2), ("everyone", 3))
    ]
    assert warnings(result) == (expected if warned else []), result.stderr


def test_values_that_set_a_policy_and_no_spawner_run_z2jhs_kubespawner_an_error(tmp_path):
    # without base.yaml: z2jh's own config sets KubeSpawner, which ignores the policy
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(config(GPUPolicy=GOOD)))
    result = cli("check", str(path))
    assert result.returncode == 1, result.stdout
    assert (
        "hub.config.JupyterHub.spawner_class: not set (z2jh's kubespawner.KubeSpawner) is "
        "KubeSpawner, which does not enforce hub.config.GPUPolicy"
    ) in result.stderr
    assert "set spawner_class: gpu-kubespawner" in result.stderr


def test_the_most_gpus_servers_can_hold_mixes_server_sizes():
    """Pure: the packing that decides the warning. 149 servers of 3/7 GPU stop 1/7
    short of 64 GPUs; one 1/7 slice beside them reaches it, so no cap falls short."""
    from fractions import Fraction

    from jupyterhub_gpu.config.deployment import most_gpus
    from jupyterhub_gpu.core.model import Amounts
    from jupyterhub_gpu.core.selection import Request

    gib = 2**30
    big = Request(gpus=Fraction(3, 7), cpu=8000, memory=64 * gib, devices=(("3g", 1),))
    small = Request(gpus=Fraction(1, 7), cpu=8000, memory=64 * gib, devices=(("1g", 1),))
    assert most_gpus([big, small], Amounts(gpus=Fraction(64))) == 64
    # memory for 3 servers: the best three are the big ones
    caps = Amounts(gpus=Fraction(64), memory=200 * gib)
    assert most_gpus([small, big], caps) == Fraction(9, 7)
    # a device cap binds too: at most one 3g slice, then the small ones
    caps = Amounts(gpus=Fraction(64), memory=200 * gib, flavors={"3g": 1})
    assert most_gpus([small, big], caps) == Fraction(5, 7)


def test_a_spawner_not_installed_where_check_runs_is_a_warning(tmp_path):
    # a site's own spawner (perhaps a GPUKubeSpawner subclass) that only its image has
    values = config(JupyterHub={"spawner_class": "mysite.spawners.SiteSpawner"}, GPUPolicy=GOOD)
    result = check(tmp_path, values)
    assert result.returncode == 0, result.stderr
    assert warnings(result) == [
        "warning: hub.config.JupyterHub.spawner_class: mysite.spawners.SiteSpawner cannot be "
        "imported here (ModuleNotFoundError: No module named 'mysite'): unless it is "
        "GPUKubeSpawner or a subclass of it, hub.config.GPUPolicy is not enforced (set "
        "spawner_class: gpu-kubespawner); install it here to have it checked"
    ]
