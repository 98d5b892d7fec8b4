"""Which server pods' labels can be true: where a group's servers run, and which pod
is a server's.

A server pod's group label, its charge annotation and the user and server it
names are written by whoever makes the pod: anyone allowed to create pods in a
namespace the hub or the service reads can write them. Two rules keep such a pod
from costing anyone:

1. **Where.** A pod counts for a group only in a namespace that group's servers
   run in: the group's own namespace (``namespace_per_group``), or the hub's (where
   every server runs without it, and where servers from before it still run). A pod
   labelled for a group anywhere else is foreign: reported, never charged.
2. **Which.** A server has one pod per start. The hub notes a start before its pod
   is made, and the spawner writes that start on the pod (its spawn annotation);
   only pods of the hub's current start of that server can be its pod, and of
   several, the first made (a copy is made after what it copies). Another pod
   naming the same user and server, of the same start, of a start the hub never
   made, or saying no start while the server's pod does, is foreign. A pod of an
   earlier start of the server (a stop that failed, then a new start in another
   namespace) is still a pod of this hub's, charged until it is gone; beside the
   server's pod, in its namespace, it cannot be (the spawner names a server's pods
   alike), and is foreign.

Pure: the callers know the pods, the namespaces and the hub's servers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from .model import Policy
from .objects import namespace_for


def foreign_namespace(
    policy: Policy, group: str, namespace: str, hub_namespace: str | None
) -> str | None:
    """Why a pod labelled for ``group`` in ``namespace`` cannot be that group's server,
    or None when it can. ``hub_namespace``: where the hub runs its servers without a
    namespace per group (None: not known, any namespace)."""
    own = namespace_for(policy, group)
    if namespace in (hub_namespace, own):
        return None
    if own is None and hub_namespace is None:
        return None  # nothing to tell it by
    where = own or hub_namespace
    return f"labelled for {group}, whose servers run in namespace {where}, not in {namespace}"


def foreign_user(claimed_user: str | None, charged_user: str) -> str | None:
    """Why a pod naming ``claimed_user`` (KubeSpawner's username annotation) while its
    charge names ``charged_user`` is nobody's server, or None: the spawner writes both
    from the same user."""
    if claimed_user is None or claimed_user == charged_user:
        return None
    return f"its charge names {charged_user} while it says it is {claimed_user}'s server"


@dataclass(frozen=True)
class Claim:
    """A pod naming one server of a user: what tells it apart from the others."""

    key: str  # namespace/name
    created: datetime | None
    #: the start of the server that made it (its spawn annotation); None: it says none
    spawn_started: datetime | None
    terminating: bool = False


def parse_time(value: str | datetime | None) -> datetime | None:
    """An ISO 8601 time as the hub writes it (``Z`` or an offset; naive: UTC)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def _namespace(claim: Claim) -> str:
    return claim.key.partition("/")[0]


def _first_made(claims: Sequence[Claim]) -> tuple[Claim | None, Claim | None]:
    """(the first made of ``claims``, or None; another made in the same second, which
    makes the first unknowable). Live pods before terminating ones."""
    live = [c for c in claims if not c.terminating] or list(claims)
    if not live:
        return None, None
    ordered = sorted(live, key=lambda c: (c.created is None, c.created or datetime.min))
    first = ordered[0]
    if len(ordered) > 1 and ordered[1].created == first.created:
        return None, ordered[1]
    return first, None


def impostors(claims: Iterable[Claim], started: datetime | None, server: str) -> dict[str, str]:
    """The pods among ``claims`` (every pod naming one server) that cannot be that
    server's, each with why; ``started``: the hub's start of the server (None: the hub
    has no such server, or has not answered yet: only pods of one start are told
    apart, the first made being that start's); ``server``: how the reasons name it
    (``ann``, ``ann/b``)."""
    claims = list(claims)
    if started is None:
        # without the hub's start, only copies of one start are told apart
        found: dict[str, str] = {}
        starts = {c.spawn_started for c in claims} - {None}
        for start in starts:
            found.update(impostors([c for c in claims if c.spawn_started == start], start, server))
        return found
    current = [c for c in claims if c.spawn_started == started]
    unsaid = [c for c in claims if c.spawn_started is None]
    genuine, tied = _first_made(current)
    legacy = None
    if genuine is None and tied is None and unsaid:
        # a server started before the spawner wrote its starts down: its pod says none
        legacy, tied_legacy = _first_made(unsaid)
        tied = tied or tied_legacy
    found = {}
    for claim in claims:
        if claim is genuine or claim is legacy:
            continue
        if claim.spawn_started is not None and claim.spawn_started < started:
            if genuine is None or _namespace(claim) != _namespace(genuine):
                continue  # an earlier start's pod (a failed stop): this hub's until it is gone
            # a server's pods in one namespace have one name: an earlier start's pod beside
            # the server's own could not have been the spawner's
            found[claim.key] = (
                f"it names an earlier start of {server}'s server, beside that server's pod "
                f"{genuine.key}, which would have had its name"
            )
            continue
        if tied is not None and (claim in current or (genuine is None and claim in unsaid)):
            found[claim.key] = (
                f"it names {server}'s server, as another pod made in the same second does: "
                "neither is taken for the server's until one is gone"
            )
        elif claim.spawn_started is None:
            found[claim.key] = (
                f"it names {server}'s server but says no start of it, while "
                f"{genuine.key if genuine else 'the server'}'s pod does"
            )
        elif claim.spawn_started > started:
            found[claim.key] = (
                f"it names a start of {server}'s server the hub never made "
                f"({claim.spawn_started:%Y-%m-%d %H:%M:%S} UTC, after the hub's "
                f"{started:%H:%M:%S})"
            )
        else:
            found[claim.key] = (
                f"it names {server}'s server, whose pod is {genuine.key if genuine else '?'} "
                "(made first by that start)"
            )
    return found
