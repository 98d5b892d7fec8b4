"""Why a server's pod is Pending, in words a notebook user understands.

The scheduler explains an unschedulable pod in one dense line per attempt::

    0/9 nodes are available: 2 Insufficient nvidia.com/gpu, 7 node(s) didn't
    match Pod's node affinity/selector. preemption: 0/9 nodes are available: ...

``explain_unschedulable`` turns that into a sentence about the server's GPU
flavor: whether the GPUs it needs are all in use (it will start when one frees
up) or no node has them at all (an admin must act). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .model import Flavor

_SUMMARY = re.compile(r"^\s*(\d+)/(\d+) nodes are available:\s*(.*)$", re.DOTALL)
_COUNTED = re.compile(r"^(\d+)\s+(.*)$")
_CORE = {"cpu": "CPU", "memory": "memory", "pods": "pod slots", "ephemeral-storage": "disk"}


def _reasons(message: str) -> tuple[int, list[tuple[int, str]]] | None:
    """(nodes in the cluster, [(node count, reason)]) from a FailedScheduling message."""
    match = _SUMMARY.match(message.split(" preemption:")[0])
    if not match:
        return None
    reasons = []
    for part in match.group(3).rstrip(". ").split(", "):
        counted = _COUNTED.match(part.strip())
        if counted:
            reasons.append((int(counted.group(1)), counted.group(2).strip().rstrip(".")))
    return int(match.group(2)), reasons


#: what a server waiting for room is told it can do
STARTS_BY_ITSELF = "The server starts by itself as soon as there is room; stop it to give up."


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def explain_unschedulable(
    message: str, flavor: Flavor | None, gpu_resources: tuple[str, ...] = ()
) -> str | None:
    """A plain-language reason for a FailedScheduling ``message``; None if it is not one.

    ``gpu_resources`` are the extended resources the server's pod requests for
    its flavor (e.g. ``nvidia.com/mig-1g.5gb``).
    """
    parsed = _reasons(message)
    if parsed is None:
        return None
    total, reasons = parsed
    what = flavor.display_name if flavor else "this server"
    short_of_gpu = 0
    short_of: list[str] = []
    elsewhere = 0  # nodes without this kind of GPU, reserved, or cordoned
    for count, reason in reasons:
        if reason.startswith("Insufficient "):
            resource = reason.removeprefix("Insufficient ").strip()
            if resource in gpu_resources:
                short_of_gpu += count
            else:
                short_of.append(f"{_CORE.get(resource, resource)} on {_nodes(count)}")
        elif reason == "Too many pods":
            short_of.append(f"pod slots on {_nodes(count)}")
        else:
            elsewhere += count
    if short_of_gpu:
        text = (
            f"Waiting for a free {what}: all of them are in use "
            f"({_nodes(short_of_gpu)} with {what} {'is' if short_of_gpu == 1 else 'are'} full)"
        )
    elif short_of:
        text = f"Waiting for room in the cluster: not enough free {', '.join(short_of)}"
    else:
        return (
            f"No node in the cluster can run {what} ({_nodes(total)} checked, none has it "
            "available to notebooks). Ask an admin: the flavor's node selector or "
            "tolerations match no node."
        )
    if short_of_gpu and short_of:
        text += f"; also short of {', '.join(short_of)}"
    return f"{text}. {STARTS_BY_ITSELF}"


def kueue_waiting(workload: dict) -> str | None:
    """Why Kueue holds a pod, from its Workload (API form); None once it is admitted.

    Kueue gates a queued pod until its Workload is admitted; the QuotaReserved
    condition says why not yet (e.g. ``couldn't assign flavors to pod set main:
    insufficient unused quota for nvidia.com/gpu in flavor jupyterhub-gpu, 1 more
    needed``). The line names the LocalQueue, as the pod's label does.
    """
    conditions = {c.get("type"): c for c in workload.get("status", {}).get("conditions", [])}
    if conditions.get("Admitted", {}).get("status") == "True":
        return None
    queue = workload.get("spec", {}).get("queueName", "?")
    for kind in ("Evicted", "QuotaReserved", "Admitted"):
        condition = conditions.get(kind)
        wanted = "True" if kind == "Evicted" else "False"
        if condition and condition.get("status") == wanted and condition.get("message"):
            return f"waiting in Kueue queue {queue}: {condition['message']}"
    return f"waiting in Kueue queue {queue}: not yet considered by Kueue"


#: the scheduling gate Kueue's pod integration puts on a queued pod until it is admitted
KUEUE_GATE = "kueue.x-k8s.io/admission"
#: the label Kueue puts on a pod's Workload: the pod's uid
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def gated_by_kueue(pod: dict) -> bool:
    """True while Kueue holds ``pod`` (API form) behind its admission gate."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == KUEUE_GATE for g in gates)


def workload_of(pod: dict, workloads: list[dict]) -> dict | None:
    """The Workload Kueue made for ``pod``: the one its owner reference names."""
    uid = (pod.get("metadata") or {}).get("uid")
    for workload in workloads:
        owners = workload.get("metadata", {}).get("ownerReferences") or []
        if uid and any(o.get("uid") == uid for o in owners):
            return workload
    return None


def _condition_true(workload: dict, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in workload.get("status", {}).get("conditions", [])
    )


def _kueue_pending(workload: dict) -> bool:
    """Waiting for quota: not holding any, not finished, not deactivated."""
    if workload.get("spec", {}).get("active") is False:
        return False
    return not any(_condition_true(workload, k) for k in ("QuotaReserved", "Admitted", "Finished"))


def kueue_position(workload: dict, workloads: list[dict]) -> int | None:
    """``workload``'s place (1: next) among the pending Workloads of its LocalQueue.

    ``workloads`` are the Workloads of its namespace. Kueue's queues order by
    priority, then by creation time (``BestEffortFIFO`` and ``StrictFIFO``
    alike); Workloads that hold quota, finished or were deactivated are not in
    line. None when ``workload`` itself is not waiting.

    Kueue's own answer is its visibility API (``pendingworkloads`` of a
    LocalQueue), which needs an aggregated API server registered with the
    cluster; this order is what that API reports for a LocalQueue, read from the
    Workloads themselves.
    """
    if not _kueue_pending(workload):
        return None
    namespace = workload.get("metadata", {}).get("namespace")
    queue = workload.get("spec", {}).get("queueName")

    in_line = [
        w
        for w in workloads
        if w.get("metadata", {}).get("namespace") == namespace
        and w.get("spec", {}).get("queueName") == queue
        and _kueue_pending(w)
    ]
    return _place(workload, in_line, lambda w: w.get("spec", {}).get("priority") or 0)


def _place(mine: dict, in_line: list[dict], priority: Callable[[dict], int]) -> int:
    """``mine``'s place (1: next) among the objects ``in_line``: higher ``priority``
    first, then the earlier (as both Kueue and Volcano order their queues), then by name."""

    def order(obj: dict) -> tuple[int, str, str]:
        meta = obj.get("metadata", {})
        # RFC 3339 timestamps of one API server sort as strings
        return (-priority(obj), meta.get("creationTimestamp") or "", meta.get("name") or "")

    key = order(mine)
    return 1 + sum(1 for obj in in_line if order(obj) < key)


def kueue_queue_line(queue: str, workload: dict | None, position: int | None) -> str:
    """What the spawn page says while Kueue holds the server's pod in ``queue``.

    E.g. ``Waiting in Kueue queue lab: position 1. Kueue: couldn't assign flavors
    to pod set main: insufficient unused quota for nvidia.com/gpu in flavor
    jupyterhub-gpu, 1 more needed. The server starts by itself when Kueue admits
    it; stop it to give up.``
    """
    prefix = f"Waiting in Kueue queue {queue}"
    reason = kueue_waiting(workload) if workload is not None else None
    if workload is None:
        why = "Kueue has not taken the server into its queue yet"
    elif reason is None:
        why = "admitted by Kueue, about to be scheduled"
    else:
        why = "Kueue: " + reason.split(": ", 1)[1]
    where = f"position {position}. " if position is not None else ""
    return (
        f"{prefix}: {where}{why.rstrip('.')}. "
        "The server starts by itself when Kueue admits it; stop it to give up."
    )


#: the annotation Volcano's PodGroup controller puts on a pod: its PodGroup's name
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
#: a PodGroup's phase while Volcano's enqueue action has not let it into its queue
VOLCANO_PENDING = "Pending"


def podgroup_of(pod: dict, podgroups: list[dict]) -> dict | None:
    """The PodGroup Volcano made for ``pod`` (API form): the one its annotation names."""
    metadata = pod.get("metadata") or {}
    name = (metadata.get("annotations") or {}).get(VOLCANO_GROUP_ANNOTATION)
    for podgroup in podgroups:
        meta = podgroup.get("metadata", {})
        if name and meta.get("name") == name and meta.get("namespace") == metadata.get("namespace"):
            return podgroup
    return None


def volcano_queued(podgroup: dict) -> bool:
    """True while Volcano keeps the PodGroup out of its queue (phase ``Pending``).

    Volcano's ``enqueue`` action moves a PodGroup to ``Inqueue`` once its queue's
    ``capability`` (and the cluster) has room for its minimum resources; until
    then none of its pods is considered for a node.
    """
    return (podgroup.get("status") or {}).get("phase", VOLCANO_PENDING) == VOLCANO_PENDING


def volcano_position(
    podgroup: dict, podgroups: list[dict], priorities: dict[str, int]
) -> int | None:
    """``podgroup``'s place (1: next) among the queued PodGroups of its queue.

    ``podgroups`` are the PodGroups of its namespace; ``priorities`` the value of
    each PriorityClass the policy's servers name (others count as 0). Volcano's
    priority plugin orders jobs by priority, then by creation time. None when
    ``podgroup`` is not queued.
    """
    if not volcano_queued(podgroup):
        return None
    queue = podgroup.get("spec", {}).get("queue")
    in_line = [
        g for g in podgroups if g.get("spec", {}).get("queue") == queue and volcano_queued(g)
    ]
    return _place(
        podgroup,
        in_line,
        lambda g: priorities.get(g.get("spec", {}).get("priorityClassName") or "", 0),
    )


def volcano_queue_line(
    queue: str, podgroup: dict, position: int | None, queue_state: str | None = None
) -> str:
    """What the spawn page says while Volcano keeps the server's PodGroup out of ``queue``.

    E.g. ``Waiting in Volcano queue lab: position 1. Volcano: the queue has no room
    for it yet (PodGroup Pending, NotEnoughResources). The server starts by itself
    when Volcano lets it in; stop it to give up.`` A queue whose state
    (``queue_state``, when known) is not ``Open`` admits nothing: the line says so.
    """
    where = f"position {position}. " if position is not None else ""
    if queue_state and queue_state != "Open":
        why = f"the queue is {queue_state}: it lets nothing in until an admin opens it"
    else:
        unschedulable = next(
            (
                c
                for c in (podgroup.get("status") or {}).get("conditions") or []
                if c.get("type") == "Unschedulable" and c.get("status") == "True"
            ),
            None,
        )
        detail = ", ".join(
            part for part in ("PodGroup Pending", (unschedulable or {}).get("reason")) if part
        )
        why = f"the queue has no room for it yet ({detail})"
    return (
        f"Waiting in Volcano queue {queue}: {where}Volcano: {why}. "
        "The server starts by itself when Volcano lets it in; stop it to give up."
    )
