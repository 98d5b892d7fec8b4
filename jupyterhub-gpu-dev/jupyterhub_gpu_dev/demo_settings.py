"""The demo's fixed names: its policy file, its admin and namespace, the schedulers it
runs or stands in for, where its database and stand-in storage live; and its error."""

from __future__ import annotations

from pathlib import Path

#: The demo's policy: a z2jh values file (``jupyterhub-gpu check`` works on it).
DEMO_VALUES = Path(__file__).with_name("demo_values.yaml")

DEMO_ADMIN = "admin"
#: where the hub runs and spawns (a policy's namespace per group is kept)
HUB_NAMESPACE = "default"
#: the schedulers the local cluster does not run: kube-scheduler answers to their
#: name (``schedulerName``), and the pods keep every label and annotation. One the
#: local cluster can run (``build.SCHEDULER_COMPONENTS``) runs for real instead.
STAND_IN_SCHEDULERS = {"kai": "kai-scheduler"}
#: the objects to list to see a scheduler the local cluster runs at work (the banner's hint)
SCHEDULER_OBJECTS = {
    "kueue": "clusterqueues,localqueues,workloads",
    "volcano": "queues.scheduling.volcano.sh,podgroups",
}
#: what each scheduler the local cluster runs does with a server's pod
SCHEDULER_ROLES = {
    "kueue": "the policy's Kueue queues admit each server's pod, then kube-scheduler places it",
    "volcano": "each server's pod waits in its group's Volcano queue until there is room, "
    "then Volcano places it",
}
#: the process whose log the banner names, where it is not the scheduler's own name
SCHEDULER_LOGS = {"volcano": "vc-scheduler"}
#: the usage database (GPU time), in the demo cluster's state folder
USAGE_DATABASE = "jupyterhub-gpu-usage.sqlite"
#: seconds between Prometheus's scrapes of the simulated DCGM exporter (each scrape
#: lists the cluster's pods and nodes: more often would only cost CPU)
SCRAPE_INTERVAL = 5.0
#: in the demo cluster's state folder: the folders serving loopback NFS exports
#: (``nfs/<server><path>``) and those behind the stand-in claims (``claims/<ns>/<claim>``)
NFS_FOLDER = "nfs"
CLAIMS_FOLDER = "claims"
#: the label of the PersistentVolumes and claims the demo stands in
STAND_IN_LABEL = {"jupyterhub-gpu.local/stand-in": "true"}


class DemoError(RuntimeError):
    """The demo cannot start; the message says what to do."""
