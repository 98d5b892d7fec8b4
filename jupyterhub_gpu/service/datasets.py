"""The claims the groups' datasets need: read from Kubernetes, kept for the views.

Every ``GPUService.datasets_interval`` seconds the service reads each
PersistentVolumeClaim a dataset names (``core.datasets.needed_claims``) by name
in the namespace where the servers that mount it run, and keeps what
``core.datasets.dataset_report`` makes of it: ``api/usage``, the dashboard and the
metric ``jupyterhub_gpu_dataset_claim_missing`` show it.

By name rather than by listing: the hub's namespace holds a claim per user's home
(z2jh's ``singleuser.storage``), thousands on a large hub, while the datasets name
a handful; and ``get`` is what the hub's spawner already has there and in each
group namespace.

A read that fails (no permission, the API server away) leaves that claim as last
found (unknown if never read) and fails the task, which names the claim, the
namespace and the error under *Service health*; the other claims are still read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ..core.datasets import DatasetState, dataset_report, missing_claims, needed_claims
from ..core.model import Policy
from ..kube.client import exception_message
from .tasks import RetryAtInterval, describe_error

log = logging.getLogger("jupyterhub_gpu.service")

#: reads a claim by (namespace, name): True if it exists, False if not (404); any
#: other failure raises
ReadClaim = Callable[[str, str], Awaitable[bool]]
#: claims read at once (a namespace per group can need hundreds)
CONCURRENT_READS = 10


def claim_reader(kube: client.ApiClient, timeout: float = 30.0) -> ReadClaim:
    """Reads claims through the service's Kubernetes client."""
    core = client.CoreV1Api(kube)

    async def exists(namespace: str, name: str) -> bool:
        try:
            await core.read_namespaced_persistent_volume_claim(
                name, namespace, _request_timeout=timeout
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise ClaimReadError(namespace, name, e) from e
        return True

    return exists


class ClaimReadError(Exception):
    """A claim the service could not read, with what to do about it."""

    def __init__(self, namespace: str, name: str, error: ApiException) -> None:
        self.status = error.status
        # the fix first: the task's error is shown cut to a few hundred characters
        hint = ""
        if error.status == 403:
            hint = (
                f"grant the hub's service account get on persistentvolumeclaims in {namespace} "
                "(`jupyterhub-gpu manifests` renders it); "
            )
        super().__init__(
            f"reading PersistentVolumeClaim {namespace}/{name}: HTTP {error.status}: {hint}"
            f"the API server said: {exception_message(error)}"
        )


class DatasetClaims:
    """The last report of the groups' datasets (``report``: group -> states)."""

    def __init__(self, policy: Policy, hub_namespace: str, read: ReadClaim | None) -> None:
        self.policy = policy
        self.hub_namespace = hub_namespace
        #: None: not wired to Kubernetes (tests feed ``found`` by hand)
        self.read = read
        #: (namespace, claim) -> whether it existed when last read
        self.found: dict[tuple[str, str], bool] = {}
        self.report: dict[str, list[DatasetState]] = self._report()

    def _report(self) -> dict[str, list[DatasetState]]:
        existing: dict[str, set[str]] = {}
        unknown = set()
        for namespace, claims in needed_claims(self.policy, self.hub_namespace).items():
            existing[namespace] = set()
            for claim in claims:
                seen = self.found.get((namespace, claim))
                if seen is None:
                    unknown.add((namespace, claim))
                elif seen:
                    existing[namespace].add(claim)
        return dataset_report(self.policy, self.hub_namespace, existing, unknown)

    async def run(self) -> str:
        """Read every claim needed; what is missing, in words (the task's result)."""
        reader = self.read
        if reader is None:
            raise RuntimeError("DatasetClaims.run needs a claim reader: pass claim_reader(kube)")
        needed = [
            (namespace, claim)
            for namespace, claims in needed_claims(self.policy, self.hub_namespace).items()
            for claim in sorted(claims)
        ]
        limit = asyncio.Semaphore(CONCURRENT_READS)

        async def read(namespace: str, claim: str) -> bool | BaseException:
            async with limit:
                try:
                    return await reader(namespace, claim)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    return e

        results = await asyncio.gather(*(read(ns, claim) for ns, claim in needed))
        failures: list[tuple[tuple[str, str], BaseException]] = []
        for key, result in zip(needed, results, strict=True):
            if isinstance(result, BaseException):
                failures.append((key, result))
            else:
                self.found[key] = result
        for (namespace, claim), error in failures:
            log.warning("dataset claim %s/%s not read: %s", namespace, claim, _words(error))
        # claims no longer needed are not kept
        self.found = {key: self.found[key] for key in needed if key in self.found}
        self.report = self._report()
        missing = missing_claims(self.report)
        summary = _summary(len(needed), missing)
        if failures:
            first = failures[0][1]
            raise DatasetCheckFailed(
                f"{len(failures)} of {len(needed)} dataset claim(s) not read, the first: "
                f"{_words(first)}"
            ) from first
        return summary


class DatasetCheckFailed(RetryAtInterval):
    """Some claims could not be read; the others were, and the report holds them. The
    check keeps its interval: a namespace not bound yet must not slow the others'."""


def _summary(needed: int, missing: list[DatasetState]) -> str:
    if not needed:
        return "no dataset needs a claim"
    if not missing:
        return f"{needed} dataset claim(s) found"
    absent = sorted({f"{s.namespace}/{s.dataset.claim}" for s in missing})
    groups = sorted({s.group for s in missing})
    return f"missing claim(s) {', '.join(absent)}: servers of {', '.join(groups)} cannot start"


def _words(error: BaseException) -> str:
    return str(error) if isinstance(error, ClaimReadError) else describe_error(error)
