"""Prometheus alerting rules for the GPU service's and the hub's metrics, in the package.

``RULES_FILE`` is a plain Prometheus rules file (``rule_files``). The same groups,
for kube-prometheus-stack, are rendered from it by ``prometheus_rule_yaml`` (a
``monitoring.coreos.com/v1`` PrometheusRule) and ``kube_prometheus_stack_values_yaml``
(the chart's ``additionalPrometheusRulesMap``); the repository keeps both in
``helm-values/alerts/``, and its tests keep them equal to this file::

    python3 -c 'import jupyterhub_gpu.alerts as a; print(a.prometheus_rule_yaml(), end="")' \\
        > helm-values/alerts/prometheusrule.yaml

The rendering is textual, so the rules file's notes on the thresholds to tune
come along.

Each alert's ``runbook_url`` points at its entry in the operations guide
(``docs/operations.md``, "What each alert means, and what to do"), under
``DOCS_URL``. A site that publishes the docs elsewhere renders every form with its
own address (``docs_url``), from the command line::

    python3 -m jupyterhub_gpu.alerts --docs-url https://docs.example.edu/jupyterhub-gpu/ \\
        prometheusrule > prometheusrule.yaml

``ALERTMANAGER_FILE`` is an example Alertmanager configuration for these alerts (their
receivers by group, e-mail and Slack, what is held back while the service is down);
``alertmanager_values_yaml`` renders it as kube-prometheus-stack values
(``alertmanager.config``), kept in ``helm-values/alerts/`` too::

    python3 -m jupyterhub_gpu.alerts kube-prometheus-stack-alertmanager \\
        > helm-values/alerts/kube-prometheus-stack-alertmanager.yaml
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

RULES_FILE = Path(__file__).with_name("jupyterhub-gpu.rules.yaml")
ALERTMANAGER_FILE = Path(__file__).with_name("alertmanager.yaml")
#: the Secret kube-prometheus-stack mounts for the Alertmanager's e-mail password and
#: Slack webhook (``ALERTMANAGER_FILE`` reads them from where it is mounted)
ALERTMANAGER_SECRET = "jupyterhub-gpu-alerting"

#: kube-prometheus-stack's Prometheus loads the rules whose ``release`` label names
#: its Helm release (its default ``ruleSelector``)
DEFAULT_RELEASE = "kube-prometheus-stack"

#: the line of the rules file from which its text is carried into the other forms
_CARRIED_FROM = "# The thresholds to tune"

#: where the built documentation is published (Sphinx's HTML: ``operations.html``
#: holds each alert's entry); a placeholder until a site renders its own address
DOCS_URL = "https://docs.example.org/jupyterhub-gpu/"

#: the page under ``DOCS_URL`` each ``runbook_url`` points into
RUNBOOK_PAGE = "operations.html"


def rules_text(docs_url: str = DOCS_URL) -> str:
    """The rules file, its runbook links under ``docs_url``."""
    if not docs_url.endswith("/"):
        docs_url += "/"
    return RULES_FILE.read_text().replace(DOCS_URL + RUNBOOK_PAGE, docs_url + RUNBOOK_PAGE)


def rule_groups(docs_url: str = DOCS_URL) -> list[dict[str, Any]]:
    """The rule groups of ``RULES_FILE``, parsed."""
    return yaml.safe_load(rules_text(docs_url))["groups"]


def _indented(text: str, indent: int) -> str:
    pad = " " * indent
    return "".join(pad + line if line.strip() else line for line in text.splitlines(True))


def _carried(indent: int, docs_url: str) -> str:
    text = rules_text(docs_url)
    return _indented(text[text.index(_CARRIED_FROM) :], indent)


def prometheus_rule_yaml(release: str = DEFAULT_RELEASE, docs_url: str = DOCS_URL) -> str:
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
        "spec:\n" + _carried(2, docs_url)
    )


def kube_prometheus_stack_values_yaml(docs_url: str = DOCS_URL) -> str:
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
        "  jupyterhub-gpu:\n" + _carried(4, docs_url)
    )


def alertmanager_values_yaml() -> str:
    """The example Alertmanager configuration as kube-prometheus-stack values."""
    text = ALERTMANAGER_FILE.read_text()
    return (
        "# kube-prometheus-stack values that route the jupyterhub-gpu alerts: the same\n"
        "# Alertmanager configuration as the package's jupyterhub_gpu/alerts/alertmanager.yaml\n"
        "# (rendered from it by jupyterhub_gpu.alerts.alertmanager_values_yaml), whose notes\n"
        "# say who is told of what. Put in your site's addresses, channels and groups, create\n"
        "# the Secret it reads the e-mail password and the Slack webhook from, and add this\n"
        "# file to the chart's values (its lists replace the chart's own routes, receivers\n"
        "# and inhibit_rules):\n"
        "#\n"
        f"#   kubectl -n monitoring create secret generic {ALERTMANAGER_SECRET} \\\n"
        "#       --from-file=smtp-password --from-file=slack-webhook-url\n"
        "#   helm upgrade kube-prometheus-stack prometheus-community/kube-prometheus-stack \\\n"
        "#       -n monitoring --reuse-values \\\n"
        "#       -f helm-values/alerts/kube-prometheus-stack-alertmanager.yaml\n"
        "alertmanager:\n"
        "  alertmanagerSpec:\n"
        f"    # mounted at /etc/alertmanager/secrets/{ALERTMANAGER_SECRET}/\n"
        f"    secrets: [{ALERTMANAGER_SECRET}]\n"
        "  config:\n" + _indented(text[text.index("\nglobal:") + 1 :], 4)
    )
