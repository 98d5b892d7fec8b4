"""Print the alerting rules in one of their forms, with a site's own docs address, or
the example Alertmanager configuration for them.

    python3 -m jupyterhub_gpu.alerts [--docs-url URL] [--release NAME] \\
        {rules,prometheusrule,kube-prometheus-stack}
    python3 -m jupyterhub_gpu.alerts {alertmanager,kube-prometheus-stack-alertmanager}
"""

from __future__ import annotations

import argparse
import sys

from . import (
    ALERTMANAGER_FILE,
    DEFAULT_RELEASE,
    DOCS_URL,
    alertmanager_values_yaml,
    kube_prometheus_stack_values_yaml,
    prometheus_rule_yaml,
    rules_text,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m jupyterhub_gpu.alerts",
        description="Print the jupyterhub-gpu alerting rules, each alert's runbook_url "
        "pointing at your copy of the docs, or an example Alertmanager configuration "
        "that routes them.",
    )
    parser.add_argument(
        "form",
        choices=[
            "rules",
            "prometheusrule",
            "kube-prometheus-stack",
            "alertmanager",
            "kube-prometheus-stack-alertmanager",
        ],
        help="a plain Prometheus rules file, a PrometheusRule object, or "
        "kube-prometheus-stack values; or the example Alertmanager configuration, "
        "plain or as kube-prometheus-stack values",
    )
    parser.add_argument(
        "--docs-url",
        default=DOCS_URL,
        help="where your built docs are published (operations.html is under it; "
        f"default: {DOCS_URL})",
    )
    parser.add_argument(
        "--release",
        default=DEFAULT_RELEASE,
        help="your kube-prometheus-stack Helm release, for the PrometheusRule's label "
        f"(default: {DEFAULT_RELEASE})",
    )
    args = parser.parse_args(argv)
    if not args.docs_url.startswith(("https://", "http://")):
        parser.error(f"--docs-url must be an http(s) address, not {args.docs_url!r}")
    if args.form == "rules":
        text = rules_text(args.docs_url)
    elif args.form == "prometheusrule":
        text = prometheus_rule_yaml(args.release, args.docs_url)
    elif args.form == "kube-prometheus-stack":
        text = kube_prometheus_stack_values_yaml(args.docs_url)
    elif args.form == "alertmanager":
        text = ALERTMANAGER_FILE.read_text()
    else:
        text = alertmanager_values_yaml()
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
