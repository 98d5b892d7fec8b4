"""Volcano's scheduler and controller-manager as local processes of the local cluster.

Volcano runs as its Helm chart runs it, minus the Deployments: the binaries built
from ``gomod/volcano`` talk to the local API server with a client certificate of
the cluster's CA, and their health servers bind 127.0.0.1.

- The controller-manager runs the PodGroup and Queue controllers only: the hub's
  servers are bare pods, for each of which it creates a PodGroup in the queue the
  pod's ``scheduling.volcano.sh/queue-name`` annotation names, and it keeps each
  Queue's state. Volcano's Job, JobFlow and garbage-collection controllers have
  nothing to do here.
- The scheduler places the pods whose ``schedulerName`` is ``volcano``. Its
  configuration is the chart's (``capacity``: a queue's ``capability`` is a hard
  cap, its ``deserved`` what ``reclaim`` takes back for it) with ``preempt`` and
  ``reclaim`` on, so a server within its group's quota takes room back from a
  lower-priority server above another group's quota.
- Volcano's admission webhooks are not run: they validate Volcano's Jobs and
  default fields the reconciler already writes (a Queue's ``weight`` and
  ``reclaimable``); the Queue state they would set at creation, the Queue
  controller sets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MODULE = "volcano.sh/volcano"
#: the name pods give as ``schedulerName`` (Volcano's default)
SCHEDULER_NAME = "volcano"
#: the queue Volcano's scheduler creates at start for pods that name none
DEFAULT_QUEUE = "default"
#: the two binaries, as ``gomod/volcano`` names them
SCHEDULER = "vc-scheduler"
CONTROLLER_MANAGER = "vc-controller-manager"
#: the controllers a cluster of bare pods needs (see the module doc)
CONTROLLERS = ("pg-controller", "queue-controller")
#: the ports each process serves on 127.0.0.1
SERVERS = ("scheduler-health", "scheduler-metrics", "controllers-health")


def scheduler_configuration(*, proportion: bool = False) -> dict[str, Any]:
    """The scheduler's configuration file: the Helm chart's plugins, with preemption.

    ``enqueue`` keeps a PodGroup ``Pending`` while its queue's ``capability`` has no
    room; ``allocate`` binds; ``preempt`` (within a queue) and ``reclaim`` (across
    queues: a queue below its ``deserved`` takes back from one above it) evict the
    lowest priority first, so an over-quota server goes before an in-quota one.
    ``proportion``: Volcano's ``proportion`` plugin instead of ``capacity``, which
    divides the cluster among queues by their ``weight`` (a site's choice).
    """
    return {
        "actions": "enqueue, allocate, preempt, reclaim, backfill",
        "tiers": [
            {
                "plugins": [
                    {"name": "priority"},
                    {"name": "gang", "enablePreemptable": False},
                    {"name": "conformance"},
                ]
            },
            {
                "plugins": [
                    {"name": "drf", "enablePreemptable": False},
                    {"name": "predicates"},
                    {"name": "proportion" if proportion else "capacity"},
                    {"name": "nodeorder"},
                    {"name": "binpack"},
                ]
            },
        ],
    }


def write_scheduler_configuration(directory: Path, *, proportion: bool = False) -> Path:
    path = directory / "volcano-scheduler.conf"
    path.write_text(yaml.safe_dump(scheduler_configuration(proportion=proportion), sort_keys=False))
    return path


def _common_flags(kubeconfig: Path, health_port: int) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--enable-healthz=true",
        f"--healthz-address=127.0.0.1:{health_port}",
        "--v=2",
    ]


def scheduler_argv(
    binary: Path, kubeconfig: Path, config: Path, ports: dict[str, int]
) -> list[str]:
    return [
        str(binary),
        *_common_flags(kubeconfig, ports["scheduler-health"]),
        f"--scheduler-conf={config}",
        f"--scheduler-name={SCHEDULER_NAME}",
        f"--default-queue={DEFAULT_QUEUE}",
        # metrics stay off; the address is set so nothing could ever bind all interfaces
        f"--listen-address=127.0.0.1:{ports['scheduler-metrics']}",
        "--schedule-period=500ms",
        # its cache dumper writes to /tmp on a signal; keep it in the cluster's folder
        f"--cache-dump-dir={config.parent}",
    ]


def controller_manager_argv(binary: Path, kubeconfig: Path, ports: dict[str, int]) -> list[str]:
    return [
        str(binary),
        *_common_flags(kubeconfig, ports["controllers-health"]),
        f"--controllers={','.join(CONTROLLERS)}",
        f"--scheduler-name={SCHEDULER_NAME}",
    ]
