"""Where each group's datasets stand: the claims they need, found or missing (pure).

A dataset backed by a PersistentVolumeClaim (``claim``) mounts only where that
claim exists: in the namespace the group's servers run in (the group's own with
``namespace_per_group``, else the hub's). The hub refuses a spawn whose claim is
missing; the GPU service reads which claims exist (``needed_claims`` says which
to read) and reports, per group, each dataset with what it found
(``dataset_report``). NFS and CSI datasets are mounted inline and need nothing.

Only a group that offers profiles starts servers of its own: a parent without
profiles lists its datasets (its children mount them too) but needs no claim in
its own namespace, so its claim datasets are ``not_needed`` there.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from .model import Dataset, Group, Policy
from .objects import namespace_for

#: the claim exists where the group's servers run (or the dataset needs no claim)
OK = "ok"
#: the claim does not exist there: every spawn of the group is refused
MISSING = "missing"
#: whether the claim exists is not known (not read yet, or the read failed)
UNKNOWN = "unknown"
#: the group starts no servers of its own (no profiles): its namespace needs no claim
NOT_NEEDED = "not_needed"


@dataclass(frozen=True)
class DatasetState:
    """One dataset of one group, and whether its claim was found."""

    group: str
    dataset: Dataset
    #: where the group's servers run, and so where the claim must be
    namespace: str
    status: str

    @property
    def missing(self) -> bool:
        return self.status == MISSING

    @property
    def problem(self) -> str | None:
        """What stands in the way, in words for the page; None when nothing does."""
        claim = self.dataset.claim
        if self.status == MISSING:
            return (
                f"claim {claim} is missing in namespace {self.namespace}: servers of this "
                "group cannot start until an admin creates it (or removes the dataset "
                "from the group)"
            )
        if self.status == UNKNOWN:
            return (
                f"whether claim {claim} exists in namespace {self.namespace} is not known "
                "yet (the service has not read it; admins see why under Service health)"
            )
        return None

    def to_json(self) -> dict[str, Any]:
        dataset = self.dataset
        return {
            "name": dataset.name,
            "display_name": dataset.display_name,
            "description": dataset.description,
            "mount_path": dataset.mount_path,
            "read_only": dataset.read_only,
            "kind": dataset.kind,
            "claim": dataset.claim,
            "namespace": self.namespace,
            "missing": self.missing,
            "status": self.status,
            "problem": self.problem,
        }


def server_namespace(policy: Policy, group: str, hub_namespace: str) -> str:
    """The namespace the group's servers run in."""
    return namespace_for(policy, group) or hub_namespace


def _starts_servers(group: Group) -> bool:
    return bool(group.profiles)


def needed_claims(policy: Policy, hub_namespace: str) -> dict[str, set[str]]:
    """Per namespace, the claims the servers that run there need (sorted by namespace)."""
    needed: dict[str, set[str]] = {}
    for group in policy.all_groups:
        if not _starts_servers(group):
            continue
        namespace = server_namespace(policy, group.name, hub_namespace)
        for dataset in policy.datasets_of(group.name):
            if dataset.claim is not None:
                needed.setdefault(namespace, set()).add(dataset.claim)
    return dict(sorted(needed.items()))


def dataset_report(
    policy: Policy,
    hub_namespace: str,
    existing: Mapping[str, Set[str]],
    unknown: Set[tuple[str, str]] = frozenset(),
) -> dict[str, list[DatasetState]]:
    """Per group (policy order, ``everyone`` last), its datasets and their state.

    ``existing``: per namespace read, the claims found there; a namespace not in it
    was not read, so its claims are unknown. ``unknown``: (namespace, claim) pairs
    whose read failed although their namespace is in ``existing``.
    """
    report: dict[str, list[DatasetState]] = {}
    for group in policy.all_groups:
        namespace = server_namespace(policy, group.name, hub_namespace)
        states = []
        for dataset in policy.datasets_of(group.name):
            claim = dataset.claim
            if claim is None:
                status = OK
            elif not _starts_servers(group):
                status = NOT_NEEDED
            elif namespace not in existing or (namespace, claim) in unknown:
                status = UNKNOWN
            elif claim in existing[namespace]:
                status = OK
            else:
                status = MISSING
            states.append(DatasetState(group.name, dataset, namespace, status))
        report[group.name] = states
    return report


def missing_claims(report: Mapping[str, list[DatasetState]]) -> list[DatasetState]:
    """The datasets whose claim is missing, group by group."""
    return [state for states in report.values() for state in states if state.missing]
