"""The server pods the spawner reads and deletes beyond KubeSpawner's own.

- The charges the hub's ledger is rebuilt from: every server pod the policy labelled,
  in every namespace servers run in, and the servers started before the policy
  (KubeSpawner's pods without its labels, see ``core.adoption``), each told once in
  the hub log. A pod whose labels cannot be true (``core.claims``: labelled for a
  group whose servers run elsewhere, or naming a server of the hub's whose pod is
  another) counts for nobody, and is told once in the hub log.
- KubeSpawner's watch of server pods, started again when it failed (an API server
  unreachable at its first list, or for longer than its watch retries).
- A stop that failed, finished in the background: the pod is deleted until it is
  gone, then its charge released.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import aiohttp
from jupyterhub.utils import isoformat
from kubernetes_asyncio.client import ApiException, V1DeleteOptions, V1Preconditions

from ..core.admission import Charge
from ..core.adoption import adopt, servers_selector, username_of
from ..core.claims import Claim, foreign_namespace, foreign_user, impostors, parse_time
from ..core.exits import NOTEBOOK_CONTAINER
from ..core.model import Policy
from ..core.quantities import format_gpus
from ..core.shaping import (
    GROUP_LABEL,
    SPAWN_ANNOTATION,
    PodShape,
    apply_to_pod,
    charge_from_pod,
    namespace_for,
    of_another_hub,
)
from ..kube.client import exception_message
from .ports import PodOwner

#: servers from before the policy whose charge the hub log has told (once each)
_adoptions_logged: set[str] = set()
#: pods counted for nobody that the hub log has told, with why (once each)
_foreign_logged: set[tuple[str, str]] = set()


async def charges_from_pods(spawner: PodOwner, policy: Policy, hub_namespace: str) -> list[Charge]:
    """The charges of every server of this hub, from its pods (``hub_namespace``: the
    hub's, where servers from before the policy run)."""
    charges = await _adopted_charges(spawner, policy, hub_namespace)
    namespaces = (
        # the hub's too: servers started before a namespace per group still run there
        list(
            dict.fromkeys(
                [*(namespace_for(policy, g.name) for g in policy.all_groups), hub_namespace]
            )
        )
        if policy.namespace_per_group
        else [spawner.namespace]
    )
    # (user, server name) -> the pods naming that server, each with its charge
    named: dict[tuple[str, str], list[tuple[Claim, Charge]]] = {}
    for namespace in namespaces:
        try:
            pods = await spawner.api.list_namespaced_pod(
                namespace,
                label_selector=GROUP_LABEL,
                _request_timeout=spawner.k8s_api_request_timeout,
            )
        except ApiException as e:
            if e.status == 404:
                continue
            raise
        for pod in pods.items:
            listed = spawner.api.api_client.sanitize_for_serialization(pod)
            if of_another_hub(listed, hub_namespace):
                continue  # e.g. a staging hub's, in group namespaces of the same names
            try:
                charge = charge_from_pod(listed)
            except ValueError as e:
                spawner.log.warning("%s; it is not counted", e)
                continue
            if charge is None:
                continue
            user = username_of(listed) or charge.user
            why = foreign_namespace(policy, charge.group, namespace, hub_namespace) or (
                foreign_user(user, charge.user)
            )
            if why:
                _tell_foreign(spawner, charge, why)
                continue
            metadata = listed.get("metadata") or {}
            annotations = metadata.get("annotations") or {}
            claim = Claim(
                charge.key,
                parse_time(metadata.get("creationTimestamp")),
                parse_time(annotations.get(SPAWN_ANNOTATION)),
                bool(metadata.get("deletionTimestamp")),
            )
            named.setdefault((user, annotations.get("hub.jupyter.org/servername", "")), []).append(
                (claim, charge)
            )
    for (user, name), pods in named.items():
        found = {}
        if len(pods) > 1:
            # several pods name one server: only the hub's start of it can tell its own
            found = impostors(
                (c for c, _ in pods),
                _hub_started(spawner, user, name),
                f"{user}/{name}" if name else user,
            )
        for claim, charge in pods:
            if claim.key in found:
                _tell_foreign(spawner, charge, found[claim.key])
            else:
                charges.append(charge)
    return charges


def _tell_foreign(spawner: PodOwner, charge: Charge, why: str) -> None:
    if (charge.key, why) in _foreign_logged:
        return
    _foreign_logged.add((charge.key, why))
    spawner.log.warning(
        "Pod %s is labelled as %s's server in %s but counted for nobody: %s. Delete it "
        "if nobody knows it.",
        charge.key,
        charge.user,
        charge.group,
        why,
    )


def _hub_started(spawner: PodOwner, user: str, name: str) -> datetime | None:
    """The hub's start of ``user``'s server ``name`` (None: not running, or offline)."""
    db = getattr(spawner.user, "db", None)
    if db is None:
        return None
    from jupyterhub import orm

    found = orm.User.find(db, user)
    for orm_spawner in found.orm_spawners.values() if found is not None else ():
        if orm_spawner.name == name and orm_spawner.server is not None:
            return parse_time(orm_spawner.started)
    return None


async def _adopted_charges(spawner: PodOwner, policy: Policy, hub_namespace: str) -> list[Charge]:
    """The charges of servers started before the policy (see ``core.adoption``):
    KubeSpawner's server pods in the hub's namespace without the policy's labels."""
    try:
        pods = await spawner.api.list_namespaced_pod(
            hub_namespace,
            label_selector=servers_selector(spawner.component_label, unlabelled=True),
            _request_timeout=spawner.k8s_api_request_timeout,
        )
    except ApiException as e:
        if e.status == 404:
            return []
        raise
    listed = [spawner.api.api_client.sanitize_for_serialization(p) for p in pods.items]
    running = [p for p in listed if not _finished(p)]
    if bool(running) != bool(spawner.admission.servers_before_policy):
        spawner.log.info(
            "%d server pods started before the GPU policy are running: new servers %s",
            len(running),
            (
                "may preempt them (GPUPolicy.adopted_servers_preemptible)"
                if policy.adopted_servers_preemptible
                else "never preempt while any runs (GPUPolicy.adopted_servers_preemptible)"
            )
            if running
            else "preempt as their PriorityClasses say",
        )
    spawner.admission.servers_before_policy = len(running)
    groups = _hub_groups(spawner, {username_of(p) for p in listed} - {""})
    charges = []
    for pod in listed:
        adopted = adopt(policy, pod, groups.get(username_of(pod), ()), spawner.component_label)
        if adopted is None:
            continue
        if adopted.key not in _adoptions_logged:
            _adoptions_logged.add(adopted.key)
            held = f"{format_gpus(adopted.request.gpus)} GPUs" + (
                f" of flavor {adopted.flavor}" if adopted.flavor else ""
            )
            if adopted.group is not None:
                spawner.log.info(
                    "Server pod %s of %s, started before the GPU policy (%s), is charged to %s: %s",
                    adopted.key,
                    adopted.user,
                    held,
                    adopted.group,
                    adopted.why,
                )
            else:
                spawner.log.warning(
                    "Server pod %s of %s, started before the GPU policy (%s), is charged "
                    "to no group: %s. Set GPUPolicy.adopted_servers_group to charge such "
                    "servers, or ask the user to restart it through a policy profile.",
                    adopted.key,
                    adopted.user,
                    held,
                    adopted.why,
                )
        if adopted.charge is not None:
            charges.append(adopted.charge)
    return charges


def _finished(pod: dict) -> bool:
    # a pod that ran to its end holds nothing a new server could take from it
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _hub_groups(spawner: PodOwner, users: Iterable[str]) -> dict[str, list[str]]:
    """Each user's JupyterHub groups, from the hub's database (none offline)."""
    db = getattr(spawner.user, "db", None)
    if db is None:
        return {}
    from jupyterhub import orm

    found = {}
    for name in users:
        user = orm.User.find(db, name)
        found[name] = [g.name for g in user.groups] if user is not None else []
    return found


async def watch_pods(spawner: PodOwner) -> None:
    """KubeSpawner's pod reflector, started again if it failed.

    Its first list fails while the API server is unreachable, and its watch gives
    up for good after about 50 s of failed retries; either way it would go on
    answering from a stale list (a new pod never seen, a spawn waiting out its
    start_timeout) until something replaced it.
    """
    reflector = spawner.pod_watch()
    first_list_failed = (
        reflector is not None
        and reflector.first_load_future.done()
        and not reflector.first_load_future.cancelled()
        and reflector.first_load_future.exception() is not None
    )
    watch = getattr(reflector, "watch_task", None)
    gave_up = watch is not None and watch.done()
    await spawner.restart_pod_watch(replace=first_list_failed or gave_up)


def finish_stop_in_background(
    spawner: PodOwner,
    error: Exception,
    now: bool,
    ended: tuple[float, bool] | None = None,
) -> None:
    """After a failed stop: delete the server's pod until it is gone, then release.

    JupyterHub forgets the server either way, so nothing else would delete the
    pod; and releasing its charge while it runs would let a group exceed its
    quota. The deletion names the pod's uid: a new pod of the same name (the user
    started again) is never touched, and its own charge never released. A pod the
    watch no longer holds is named by the one the hub last saw; one it never saw, by
    which start of the server it is (its spawn annotation), its uid read before
    each deletion.

    ``ended``: when its GPU time ends, and whether that is inferred (a stop asked
    for ends when asked, not when the pod is finally gone); None: when it is gone.
    """
    key = spawner._server_key
    charge = spawner.admission.charge(key)
    reflector = getattr(spawner, "pod_reflector", None)
    pod = reflector.pods.get(key) if reflector else None
    end = getattr(spawner, "_server_end", None)
    seen = end.pod_seen if end is not None else None
    uid = ((pod or seen or {}).get("metadata") or {}).get("uid")
    started = getattr(getattr(spawner, "orm_spawner", None), "started", None)
    spawn = isoformat(started) if uid is None and isinstance(started, datetime) else None
    spawner.log.warning(
        "Stopping %s failed (%s); its pod %s stays charged and is deleted when the "
        "Kubernetes API answers",
        spawner._log_name,
        error,
        key,
    )
    spawner.admission.finish_in_background(
        _delete_until_gone(
            spawner, spawner.namespace, spawner.pod_name, uid, charge, now, spawn, ended
        )
    )


async def _delete_until_gone(
    spawner: PodOwner,
    namespace: str,
    name: str,
    uid: str | None,
    charge: Charge | None,
    now: bool,
    spawn: str | None = None,
    ended: tuple[float, bool] | None = None,
) -> None:
    delay = 1.0
    while True:
        try:
            if uid is None:
                # never seen: the pod of this start of the server, if the name still is
                found = await spawner.api.read_namespaced_pod(
                    name, namespace, _request_timeout=spawner.k8s_api_request_timeout
                )
                started = (found.metadata.annotations or {}).get(SPAWN_ANNOTATION)
                if spawn is not None and started not in (None, spawn):
                    break  # a newer start's pod: this one is gone
                uid = found.metadata.uid
            options = V1DeleteOptions(
                grace_period_seconds=0 if now else spawner.delete_grace_period,
                preconditions=V1Preconditions(uid=uid),
            )
            await spawner.api.delete_namespaced_pod(
                name, namespace, body=options, _request_timeout=spawner.k8s_api_request_timeout
            )
        except ApiException as e:
            if e.status in (404, 409):  # gone, or a new server's pod has the name now
                break
            spawner.log.warning("Deleting pod %s/%s: %s", namespace, name, exception_message(e))
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass  # still unreachable
        await asyncio.sleep(delay)
        delay = min(delay * 2, 10)
    key = f"{namespace}/{name}"
    at, inferred = ended if ended is not None else (None, False)
    spawner.admission.record_stop(key, at=at, uid=uid, inferred=inferred)
    if charge is not None:
        await spawner.admission.release(spawner.gpu_policy, key, only=charge)
    spawner.log.info("Pod %s is gone: the stop of %s is complete", key, spawner._log_name)


def shaped_manifest(pod: Any, shape: PodShape | None, started: datetime | None) -> None:
    """KubeSpawner's pod manifest shaped in place by the policy (``shape``), marked with
    which start of the server it is (``started``, noted by the hub before the start),
    and set to keep the end of a failing server's log in its status."""
    if shape is not None:
        apply_to_pod(pod, shape)
    if isinstance(started, datetime):
        pod.metadata.annotations = {
            **(pod.metadata.annotations or {}),
            SPAWN_ANNOTATION: isoformat(started),
        }
    # where the spawn's failure reads it without pods/log (server_exit); a site's own wins
    for container in pod.spec.containers:
        if container.name == NOTEBOOK_CONTAINER and not container.termination_message_policy:
            container.termination_message_policy = "FallbackToLogsOnError"
