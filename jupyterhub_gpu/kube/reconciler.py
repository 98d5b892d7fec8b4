"""Keep the cluster's objects in step with the policy: a thin async adapter.

``manifests.desired_objects`` says what should exist; this module only compares
and writes::

    reconciler = Reconciler(api_client, hub_namespace="jhub")
    report = await reconciler.reconcile(policy)
    if report.errors: log(report.summary())

One pass lists every kind it manages once (by the ownership labels), then:

- applies (server-side apply, field manager ``jupyterhub-gpu``, ``force``: the
  policy is the source of truth for the fields it sets) only objects that are
  missing or drifted: a live object is unchanged when it carries the hash of the
  desired object in ``APPLIED_HASH`` *and* every desired field still has its
  value (quantities compared by value), so both a policy change and someone
  editing our fields are caught;
- deletes objects carrying both ownership labels that are no longer desired,
  with three guards, as deleting is the one thing that cannot be undone:
  nothing is pruned for a policy without groups (what a policy that failed to
  load looks like; ``remove_all`` is the explicit way to delete everything);
  a Namespace is deleted only when the reconciler was made with
  ``prune_namespaces=True``, and never while it holds pods (both are reported
  instead, in ``ReconcileReport.kept``);
- writes only into namespaces that are its own: never the hub's, and never an
  existing namespace without both ownership labels unless the policy's
  ``adopt_namespaces`` lists it (each such namespace is an error naming it and the
  fix, and nothing is written into it: no label, quota or network policy);
- with ``dry_run=True`` writes nothing and reports what it would write;
- never raises for one object's API error: each is an entry in
  ``ReconcileReport.errors`` with the kind, the name and the fix (a missing
  scheduler CRD names the CRD and how to install it), and the other kinds go on.

A pass that changes nothing makes no write (``report.writes == 0``). Callers
(the hub service) run ``reconcile`` periodically, e.g. every 60 s and at once
after a policy change, and back off (doubling up to a few minutes) while
``report.errors`` is non-empty; an exception escaping ``reconcile`` means the API
server itself is unreachable and is retried the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from ..core.manifests import HUB_LABEL, OWNER, OWNER_LABEL, desired_objects, identity
from ..core.model import Policy
from .client import exception_message
from .managed_kinds import (
    KIND_BY_TYPE,
    KINDS,
    Kind,
    delete_command,
    kind_text,
    namespace_of,
    object_name,
)
from .object_compare import APPLIED_HASH, applied_hash, contains
from .reconcile_report import ObjectError, ReconcileReport

# what callers import from here, some of it defined in the modules above
__all__ = [
    "APPLIED_HASH",
    "FIELD_MANAGER",
    "KINDS",
    "Kind",
    "ObjectError",
    "ReconcilePasses",
    "ReconcileReport",
    "Reconciler",
    "applied_hash",
    "contains",
]

FIELD_MANAGER = "jupyterhub-gpu"


class Reconciler:
    """Applies ``desired_objects(policy, hub_namespace)`` and prunes what we own beyond it."""

    def __init__(
        self,
        api_client: ApiClient,
        hub_namespace: str,
        *,
        concurrency: int = 16,
        prune_namespaces: bool = False,
        dry_run: bool = False,
    ) -> None:
        self.api = api_client
        self.hub_namespace = hub_namespace
        #: delete Namespaces the policy no longer implies (never while they hold pods)
        self.prune_namespaces = prune_namespaces
        #: compare and report, write nothing
        self.dry_run = dry_run
        self.selector = f"{OWNER_LABEL}={OWNER},{HUB_LABEL}={hub_namespace}"
        self._limit = asyncio.Semaphore(concurrency)
        #: API writes since this object was made (applies and deletes)
        self.writes = 0

    async def _call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        async with self._limit:
            response = await self.api.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                response_types_map={},
            )
            try:
                body = await response.read()
            finally:
                response.release()
            if not 200 <= response.status <= 299:
                error = ApiException(status=response.status, reason=response.reason)
                error.body = body.decode(errors="replace")
                raise error
            return json.loads(body)

    async def _list(self, kind: Kind, namespace: str | None = None) -> list[dict[str, Any]]:
        data = await self._call("GET", kind.path(namespace), [("labelSelector", self.selector)])
        items = data.get("items") or []
        for item in items:  # lists omit these; identity() needs them
            item.setdefault("apiVersion", kind.api_version)
            item.setdefault("kind", kind.kind)
        return items

    async def _list_namespaced(
        self, kind: Kind, wanted: set[str], owned: set[str]
    ) -> list[dict[str, Any]]:
        """``kind``'s objects of ours in the namespaces servers run in (``wanted``) and in
        those we made (``owned``): namespace by namespace, as the rendered RBAC grants
        these kinds only there, never cluster wide. A namespace we made but may no longer
        read (its RoleBindings gone with the group) holds nothing we can prune."""
        items: list[dict[str, Any]] = []
        for namespace in sorted(wanted | owned):
            try:
                items += await self._list(kind, namespace)
            except ApiException as e:
                if e.status == 403 and namespace not in wanted:
                    continue
                raise
        return items

    async def _apply(self, kind: Kind, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.writes += 1
        await self._call(
            "PATCH",
            kind.path(meta.get("namespace"), meta["name"]),
            # Strict: a field the API does not know is an error, never silently pruned
            [("fieldManager", FIELD_MANAGER), ("force", "true"), ("fieldValidation", "Strict")],
            obj,
            "application/apply-patch+yaml",
        )

    async def _delete(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        self.writes += 1
        await self._call(
            "DELETE",
            kind.path(meta.get("namespace"), meta["name"]),
            body={"propagationPolicy": "Background"},
        )

    @staticmethod
    def _error_message(kind: Kind, error: ApiException) -> str:
        if error.status == 404 and kind.fix:
            return f"the API server does not know this kind: {kind.fix}"
        return f"HTTP {error.status}: {exception_message(error)}"

    async def reconcile(self, policy: Policy) -> ReconcileReport:
        """One pass: apply what is missing or drifted, prune what we own beyond the policy.

        A policy without groups prunes nothing: it is what a policy that failed to
        load looks like, and pruning for it would delete every group's objects.
        """
        objects = desired_objects(policy, self.hub_namespace)
        # one list of our namespaces per pass, for the ownership check and the pass alike
        listed = await self._list_namespaces()
        objects, refused, adopted = await self._only_our_namespaces(policy, objects, listed)
        if not policy.groups:
            report = await self._reconcile(
                objects,
                prune=False,
                why_not="the policy has no groups (pruning skipped)",
                listed_namespaces=listed,
            )
        else:
            report = await self._reconcile(
                objects,
                prune=True,
                namespaces=self.prune_namespaces,
                listed_namespaces=listed,
            )
        report.errors[:0] = refused
        report.adopted += adopted
        return report

    async def _list_namespaces(self) -> list[dict[str, Any]] | ApiException:
        """Our namespaces, or the API server's refusal to list them (reported by the
        pass; any other error, the API server not being there, is raised)."""
        try:
            return await self._list(KIND_BY_TYPE[("v1", "Namespace")])
        except ApiException as e:
            return e

    async def _only_our_namespaces(
        self,
        policy: Policy,
        objects: list[dict[str, Any]],
        listed: list[dict[str, Any]] | ApiException,
    ) -> tuple[list[dict[str, Any]], list[ObjectError], list[str]]:
        """``objects`` without those in a namespace that is not ours to write: the hub's
        own, or an existing one without this hub's ownership labels that the policy's
        ``adopt_namespaces`` does not list (a typo in a group's name or prefix must not
        take over someone's namespace, and labelling it ours would let a later prune
        delete it). Each such namespace is an error naming it and the fix; with the
        errors, the namespaces adopted this pass.

        ``listed`` is the pass's list of our namespaces; a namespace missing from it is
        read by name, which happens only until it is made (or adopted)."""
        wanted = [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"]
        if not wanted:
            return objects, [], []
        ns_kind = KIND_BY_TYPE[("v1", "Namespace")]
        if isinstance(listed, ApiException):
            why = (
                "this hub's namespaces could not be listed to tell which are its own, so "
                f"nothing is written into it: {self._error_message(ns_kind, listed)}"
            )
            refused_all = set(wanted)
            kept = [o for o in objects if namespace_of(o) not in refused_all]
            return kept, [ObjectError(kind_text(ns_kind), n, why) for n in wanted], []
        ours = {o["metadata"]["name"] for o in listed}
        refused: dict[str, str] = {}
        adopted: list[str] = []
        for name in wanted:
            if name == self.hub_namespace:
                refused[name] = (
                    "is the hub's own namespace, where the hub, the proxy and servers from "
                    "before the policy run: nothing is written into it; set "
                    "GPUPolicy.namespace_prefix (e.g. 'jh-') or rename the group"
                )
                continue
            if name in ours:
                continue
            try:
                live = await self._call("GET", ns_kind.path(name=name))
            except ApiException as e:
                if e.status == 404:
                    continue  # not there yet: ours to create
                refused[name] = (
                    "could not be read to tell whether it is this hub's, so nothing is "
                    f"written into it: {self._error_message(ns_kind, e)}"
                )
                continue
            labels = live.get("metadata", {}).get("labels") or {}
            if name in policy.adopt_namespaces:
                adopted.append(
                    f"Namespace {name}: existed without this hub's labels; adopted, as "
                    "GPUPolicy.adopt_namespaces lists it"
                )
                continue
            if labels.get(OWNER_LABEL) == OWNER and labels.get(HUB_LABEL):
                whose = f"the hub's in namespace {labels[HUB_LABEL]} (its {HUB_LABEL} label)"
            else:
                whose = f"not made by this service (no {OWNER_LABEL}={OWNER} label)"
            refused[name] = (
                f"exists and is {whose}, so nothing is written into it: if this group's "
                "servers are meant to run there, list it in GPUPolicy.adopt_namespaces; "
                "otherwise set GPUPolicy.namespace_prefix or rename the group"
            )
        if not refused:
            return objects, [], adopted
        kept = [o for o in objects if namespace_of(o) not in refused]
        errors = [ObjectError(kind_text(ns_kind), n, why) for n, why in refused.items()]
        return kept, errors, adopted

    async def remove_all(self) -> ReconcileReport:
        """Delete every object this hub owns, namespaces included unless they hold pods
        (uninstalling the bundle, tests)."""
        return await self._reconcile([], prune=True, namespaces=True)

    async def _reconcile(
        self,
        objects: list[dict[str, Any]],
        *,
        prune: bool,
        namespaces: bool = False,
        why_not: str = "",
        listed_namespaces: list[dict[str, Any]] | ApiException | None = None,
    ) -> ReconcileReport:
        report = ReconcileReport(dry_run=self.dry_run)
        writes_before = self.writes
        desired: dict[Kind, list[dict[str, Any]]] = {k: [] for k in KINDS}
        for obj in objects:  # fresh from desired_objects: ours to annotate
            kind = KIND_BY_TYPE[(obj["apiVersion"], obj["kind"])]
            annotations = obj["metadata"].setdefault("annotations", {})
            annotations[APPLIED_HASH] = applied_hash(obj)
            desired[kind].append(obj)

        namespace_kind = KIND_BY_TYPE[("v1", "Namespace")]
        if listed_namespaces is None:
            listed_namespaces = await self._list_namespaces()
        other_cluster_kinds = [k for k in KINDS if not k.namespaced and k is not namespace_kind]
        cluster_kinds = [namespace_kind, *other_cluster_kinds]
        lists = [
            listed_namespaces,
            *await asyncio.gather(
                *(self._list(k) for k in other_cluster_kinds), return_exceptions=True
            ),
        ]
        owned = [] if isinstance(listed_namespaces, BaseException) else listed_namespaces
        wanted = {
            o["metadata"]["namespace"] for kind in KINDS if kind.namespaced for o in desired[kind]
        } | {self.hub_namespace}
        owned_names = {o["metadata"]["name"] for o in owned}
        namespaced_kinds = [k for k in KINDS if k.namespaced]
        lists = dict(zip(cluster_kinds, lists, strict=True)) | dict(
            zip(
                namespaced_kinds,
                await asyncio.gather(
                    *(self._list_namespaced(k, wanted, owned_names) for k in namespaced_kinds),
                    return_exceptions=True,
                ),
                strict=True,
            )
        )
        lists = [lists[k] for k in KINDS]
        live: dict[Kind, dict[tuple, dict[str, Any]] | None] = {}
        for kind, result in zip(KINDS, lists, strict=True):
            if isinstance(result, ApiException):
                live[kind] = None
                # a kind we want but cannot list: report once per object, skip the kind;
                # a kind we do not want and the server does not know owns nothing of ours
                if desired[kind] or result.status != 404:
                    message = self._error_message(kind, result)
                    for obj in desired[kind] or [{"metadata": {"name": "*"}}]:
                        report.errors.append(
                            ObjectError(kind_text(kind), object_name(obj), message)
                        )
            elif isinstance(result, BaseException):
                raise result
            else:
                live[kind] = {identity(o): o for o in result}

        # compare first (no task per object: most passes write nothing), then write
        # namespaces before what lives in them, cluster objects before namespaced ones
        for kind in KINDS:
            if live[kind] is None:
                continue
            writes = [
                (obj, current)
                for obj in desired[kind]
                if self._needs_apply(kind, obj, current := live[kind].get(identity(obj)), report)
            ]
            await asyncio.gather(*(self._sync(kind, obj, cur, report) for obj, cur in writes))
        for kind in reversed(KINDS):
            if live[kind] is None:
                continue
            wanted = {identity(o) for o in desired[kind]}
            stale = [o for key, o in live[kind].items() if key not in wanted]
            if not prune:
                report.kept += [f"{kind.kind} {object_name(o)}: {why_not}" for o in stale]
                continue
            if kind.kind == "Namespace" and not namespaces:
                report.kept += [
                    f"Namespace {object_name(o)}: no longer in the policy; prune_namespaces is "
                    "off, so it stays (delete it yourself, or turn prune_namespaces on)"
                    for o in stale
                ]
                continue
            await asyncio.gather(*(self._prune(kind, o, report) for o in stale))
        report.writes = self.writes - writes_before
        return report

    @staticmethod
    def _needs_apply(
        kind: Kind, obj: dict[str, Any], current: Mapping[str, Any] | None, report: ReconcileReport
    ) -> bool:
        if current is None:
            return True
        meta = current["metadata"]
        if meta.get("deletionTimestamp"):
            report.errors.append(
                ObjectError(
                    kind_text(kind),
                    object_name(obj),
                    "is being deleted (pruned earlier or deleted by someone); "
                    "it is created again on a pass after it is gone",
                )
            )
            return False
        same_hash = (meta.get("annotations") or {}).get(APPLIED_HASH) == (
            obj["metadata"]["annotations"][APPLIED_HASH]
        )
        # our last apply is the policy's current one, and nobody else has written
        # the object since (only we, or controllers through the status subresource)
        if same_hash and all(
            m.get("manager") == FIELD_MANAGER or m.get("subresource") == "status"
            for m in meta.get("managedFields") or []
        ):
            report.unchanged += 1
            return False
        # someone else wrote too: unchanged only if every field we set still holds
        if same_hash and contains(current, obj):
            report.unchanged += 1
            return False
        return True

    async def _sync(
        self,
        kind: Kind,
        obj: dict[str, Any],
        current: Mapping[str, Any] | None,
        report: ReconcileReport,
    ) -> None:
        try:
            if not self.dry_run:
                await self._apply(kind, obj)
        except ApiException as e:
            report.errors.append(
                ObjectError(kind_text(kind), object_name(obj), self._error_message(kind, e))
            )
            return
        (report.created if current is None else report.updated).append(
            f"{kind.kind} {object_name(obj)}"
        )

    async def _pods_in(self, namespace: str) -> int:
        data = await self._call("GET", f"/api/v1/namespaces/{quote(namespace)}/pods")
        return len(data.get("items") or [])

    async def _prune(self, kind: Kind, obj: Mapping[str, Any], report: ReconcileReport) -> None:
        if obj["metadata"].get("deletionTimestamp"):
            return  # already going
        try:
            if kind.kind == "Namespace" and (pods := await self._pods_in(object_name(obj))):
                # deleting it would delete its servers with it: the policy change
                # that dropped the group does not say to stop them
                report.kept.append(
                    f"Namespace {object_name(obj)}: holds {pods} pod{'s' if pods != 1 else ''}; "
                    "not deleted (stop its servers, and a later pass deletes it)"
                )
                return
            if self.dry_run:
                report.pruned.append(f"{kind.kind} {object_name(obj)}")
                return
            await self._delete(kind, obj)
        except ApiException as e:
            if e.status == 404:  # gone meanwhile (e.g. with its namespace)
                return
            if e.status == 403:
                # the rendered RBAC names only the current policy's objects: one the
                # policy dropped is the admin's to delete, which is no fault of the pass
                report.kept.append(
                    f"{kind.kind} {object_name(obj)}: no longer in the policy, and the hub's RBAC "
                    "(rendered for the current policy) may not delete it; delete it "
                    f"yourself: {delete_command(kind, obj)}"
                )
                return
            report.errors.append(
                ObjectError(kind_text(kind), object_name(obj), self._error_message(kind, e))
            )
            return
        report.pruned.append(f"{kind.kind} {object_name(obj)}")


class ReconcilePasses:
    """Passes of one reconciler as a periodic task runs them: a pass with errors
    raises (the task retries with backoff and shows it); the log gets every pass
    that writes, and a pass that only keeps or would write when that changes."""

    def __init__(self, reconciler: Reconciler, log: logging.Logger) -> None:
        self.reconciler = reconciler
        self.log = log
        self._last = ""

    async def run(self, policy: Policy) -> str:
        report = await self.reconciler.reconcile(policy)
        if report.errors:
            raise RuntimeError(report.summary())
        summary = report.summary()
        if report.writes or (not report.unchanged_only and summary != self._last):
            self.log.info("reconcile: %s", summary)
        self._last = summary
        return summary
