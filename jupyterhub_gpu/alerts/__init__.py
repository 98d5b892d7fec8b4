"""Prometheus alerting rules for the GPU service's metrics, shipped with the package.

``RULES_FILE`` is a plain Prometheus rules file (``rule_files``). The same groups,
for kube-prometheus-stack, are rendered from it by ``prometheus_rule_yaml`` (a
``monitoring.coreos.com/v1`` PrometheusRule) and ``kube_prometheus_stack_values_yaml``
(the chart's ``additionalPrometheusRulesMap``); the repository keeps both in
``helm-values/alerts/``, and its tests keep them equal to this file::

    python3 -c 'import jupyterhub_gpu.alerts as a; print(a.prometheus_rule_yaml(), end="")' \\
        > helm-values/alerts/prometheusrule.yaml

The rendering is textual, so the rules file's notes on the thresholds to tune
come along.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

RULES_FILE = Path(__file__).with_name("jupyterhub-gpu.rules.yaml")

#: kube-prometheus-stack's Prometheus loads the rules whose ``release`` label names
#: its Helm release (its default ``ruleSelector``)
DEFAULT_RELEASE = "kube-prometheus-stack"

#: the line of the rules file from which its text is carried into the other forms
_CARRIED_FROM = "# The thresholds to tune"


def rule_groups() -> list[dict[str, Any]]:
    """The rule groups of ``RULES_FILE``, parsed."""
    return yaml.safe_load(RULES_FILE.read_text())["groups"]


def _carried(indent: int) -> str:
    text = RULES_FILE.read_text()
    start = text.index(_CARRIED_FROM)
    pad = " " * indent
    return "".join(pad + line if line.strip() else line for line in text[start:].splitlines(True))


def prometheus_rule_yaml(release: str = DEFAULT_RELEASE) -> str:
    """The rules as a PrometheusRule object, for ``kubectl apply``."""
    return (
        "# The jupyterhub-gpu alerting rules as a PrometheusRule (monitoring.coreos.com/v1),\n"
        "# for kube-prometheus-stack or any Prometheus Operator. The same groups as the\n"
        "# package's jupyterhub_gpu/alerts/jupyterhub-gpu.rules.yaml (rendered from it by\n"
        "# jupyterhub_gpu.alerts.prometheus_rule_yaml). Load them into the namespace of\n"
        "# your Prometheus:\n"
        "#\n"
        "#   kubectl apply -n monitoring -f helm-values/alerts/prometheusrule.yaml\n"
        "#\n"
        "# The release label must name your kube-prometheus-stack Helm release: its\n"
        "# Prometheus loads only the rules labelled so (prometheusSpec.ruleSelector).\n"
        "apiVersion: monitoring.coreos.com/v1\n"
        "kind: PrometheusRule\n"
        "metadata:\n"
        "  name: jupyterhub-gpu\n"
        "  labels:\n"
        "    app.kubernetes.io/name: jupyterhub-gpu\n"
        f"    release: {release}\n"
        "spec:\n" + _carried(2)
    )


def kube_prometheus_stack_values_yaml() -> str:
    """The rules as kube-prometheus-stack values (``additionalPrometheusRulesMap``)."""
    return (
        "# kube-prometheus-stack values that load the jupyterhub-gpu alerting rules: the\n"
        "# same groups as the package's jupyterhub_gpu/alerts/jupyterhub-gpu.rules.yaml\n"
        "# (rendered from it by jupyterhub_gpu.alerts.kube_prometheus_stack_values_yaml).\n"
        "# Add this file to the chart's own values (the chart labels the PrometheusRule\n"
        "# it makes with its release, so its Prometheus loads it):\n"
        "#\n"
        "#   helm upgrade kube-prometheus-stack prometheus-community/kube-prometheus-stack \\\n"
        "#       -n monitoring --reuse-values -f helm-values/alerts/kube-prometheus-stack.yaml\n"
        "additionalPrometheusRulesMap:\n"
        "  jupyterhub-gpu:\n" + _carried(4)
    )
