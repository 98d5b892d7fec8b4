"""A local cluster's state: the folder it lives in and the file that finds it again, the
range of loopback addresses its pods take (one no other local cluster on this machine
holds), and the error the local cluster raises."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import build, sockets

#: Pod IPs come from one /18 of this range per cluster: two clusters running at
#: once (a test session and the demo) must never give out the same pod IP, or one
#: hub would reach the other cluster's notebook server on it.
POD_RANGE = ipaddress.ip_network("127.64.0.0/10")
POD_PREFIX = 18
#: what a start says as it goes (a line at a time)
ProgressFn = Callable[[str], None]


class ClusterError(RuntimeError):
    pass


def state_root() -> Path:
    return build.cache_dir() / "clusters"


def choose_pod_cidr(in_use: set[str], rng: random.Random | None = None) -> str:
    """A /18 of POD_RANGE holding none of ``in_use`` (IPs or CIDRs), as kwok's --cidr.

    Random among the free blocks, so clusters started at the same moment (before
    either has a pod listening) still almost never share one.
    """
    taken = [ipaddress.ip_network(a, strict=False) for a in in_use]
    free = [
        block
        for block in POD_RANGE.subnets(new_prefix=POD_PREFIX)
        if not any(block.overlaps(t) for t in taken)
    ]
    if not free:
        raise ClusterError(f"every /{POD_PREFIX} of {POD_RANGE} is in use by other local clusters")
    block = (rng or random).choice(free)
    return f"{block.network_address + 1}/{POD_PREFIX}"  # kwok takes the gateway address


def running_state_files() -> set[Path]:
    """The state files of every cluster with a process running on this machine, wherever
    its folder is (a test session keeps its clusters in its own temporary folders): each
    process a cluster starts runs in the cluster's state folder."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or another user's
            state_file = Path(os.readlink(entry / "cwd")) / "state.json"
            if state_file.is_file():
                found.add(state_file)
    return found


def pod_addresses_in_use() -> set[str]:
    """Pod ranges of the clusters in the state folder and of every running cluster, and
    every listening loopback IP."""
    in_use = sockets.listening_hosts()
    root = state_root()
    state_files = set(root.glob("*/state.json")) if root.is_dir() else set()
    for state_file in state_files | running_state_files():
        # a folder being written or removed right now, or saved before pod_cidr
        # existed (those used 127.64.0.1/16; their pods show up as listening)
        with contextlib.suppress(OSError, ValueError, KeyError):
            in_use.add(json.loads(state_file.read_text())["pod_cidr"])
    return {a for a in in_use if ipaddress.ip_address(a.split("/")[0]) in POD_RANGE}


@dataclass
class ClusterState:
    """What ``up`` started, persisted so other commands can find and stop it."""

    name: str
    directory: str
    ports: dict[str, int]
    pids: dict[str, int] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    #: kwok's --cidr (states saved before it was chosen per cluster used this one)
    pod_cidr: str = "127.64.0.1/16"
    #: scheduler names kube-scheduler also answers to, placing their pods as its own
    #: (stand-ins for schedulers this cluster does not run, e.g. kai-scheduler)
    stand_in_schedulers: list[str] = field(default_factory=list)
    #: schedulers this cluster runs besides kube-scheduler (``kueue``)
    schedulers: list[str] = field(default_factory=list)
    #: Kueue's fair sharing (its ``fairSharing`` configuration) is on
    kueue_fair_sharing: bool = False
    #: Volcano divides the cluster among queues by weight (its ``proportion`` plugin)
    volcano_proportion: bool = False

    @property
    def path(self) -> Path:
        return Path(self.directory)

    @property
    def kubeconfig(self) -> Path:
        return self.path / "pki" / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def save(self) -> None:
        (self.path / "state.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: Path) -> ClusterState:
        return cls(**json.loads((directory / "state.json").read_text()))
