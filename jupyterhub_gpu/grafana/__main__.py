"""Print the Grafana dashboard as JSON, or as a ConfigMap for kube-prometheus-stack.

python3 -m jupyterhub_gpu.grafana {dashboard,configmap}
"""

from __future__ import annotations

import argparse
import sys

from . import DASHBOARD_FILE, configmap_yaml


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m jupyterhub_gpu.grafana",
        description="Print the jupyterhub-gpu Grafana dashboard.",
    )
    parser.add_argument(
        "form",
        choices=["dashboard", "configmap"],
        help="the dashboard's JSON (to import into Grafana), or a ConfigMap that "
        'kube-prometheus-stack\'s Grafana sidecar loads (label grafana_dashboard: "1")',
    )
    args = parser.parse_args(argv)
    sys.stdout.write(DASHBOARD_FILE.read_text() if args.form == "dashboard" else configmap_yaml())
    return 0


if __name__ == "__main__":
    sys.exit(main())
