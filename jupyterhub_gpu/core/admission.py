"""Admission: may this server start, charged to this group, and in which tier?

The ``Ledger`` holds one ``Charge`` per server (running, pending or reserved),
and per-group and per-user totals kept in step with them. ``admit`` checks a
request against the charged group, each of its parents, and the user's caps,
and records the charge in the same synchronous call: with the hub's single
event loop, nothing can run between the check and the reservation, so
concurrent spawns can never jointly exceed a quota.

The ledger is never the only copy: every charge is written on its pod (labels
and an annotation), and ``Ledger.from_charges`` rebuilds it from pods at start.
Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from . import words
from .model import Amounts, Group, Passed, Policy
from .selection import Request

IN_QUOTA = "in-quota"
OVER_QUOTA = "over-quota"

#: why a request was refused, in one word (the hub counts refused spawns by it)
REFUSED_USER_CAP = "user_cap"
REFUSED_TOO_LARGE = "too_large"
REFUSED_GROUP_FULL = "group_full"


@dataclass
class Usage:
    gpus: Fraction = Fraction(0)
    cpu: int = 0
    memory: int = 0
    servers: int = 0
    flavors: Counter = field(default_factory=Counter)

    def add(self, request: Request, sign: int = 1) -> None:
        self.gpus += sign * request.gpus
        self.cpu += sign * request.cpu
        self.memory += sign * request.memory
        self.servers += sign * request.servers
        for flavor, units in request.devices:
            self.flavors[flavor] += sign * units
            if self.flavors[flavor] == 0:
                del self.flavors[flavor]

    def is_zero(self) -> bool:
        return not (self.gpus or self.cpu or self.memory or self.servers or self.flavors)


@dataclass(frozen=True)
class Charge:
    key: str  # the server's identity, "<namespace>/<pod name>"
    user: str
    group: str
    request: Request
    tier: str


@dataclass(frozen=True)
class Decision:
    outcome: str  # "admit", "wait" or "refuse"
    tier: str = IN_QUOTA
    reason: str = ""
    #: for "wait": the group whose limit it waits for (the group or a parent)
    level: str | None = None
    #: for "refuse": why, in one word (``REFUSED_*``)
    kind: str = ""

    @property
    def admitted(self) -> bool:
        return self.outcome == "admit"


def _exceeded(used: Usage, request: Request, caps: Amounts) -> Passed | None:
    """The first cap ``used + request`` would pass, or None."""
    return caps.first_passed(request, used)


def amount(policy: Policy, text: str, unit: str) -> str:
    """``4 GPUs``, ``1 CPU``, ``64Gi of memory``, ``1 server``, ``2 A100``: a cap's
    number and its unit (a flavor by its display name)."""
    if unit == "memory":
        return f"{text} of memory"
    singular = {"GPUs": "GPU", "CPUs": "CPU", "servers": "server"}.get(unit)
    if singular is not None:
        return f"{text} {words.noun(text, singular)}"
    flavor = policy.flavors.get(unit)
    return f"{text} {flavor.display_name if flavor is not None else unit}"


def user_cap_reason(policy: Policy, group: Group, passed: Passed) -> str:
    """A spawn past the user's own caps in ``group``: waiting would not help, stopping
    one of their servers would."""
    name = group.display_name
    if passed.unit == "servers" and passed.cap == "1":
        return f"you already run your one {name} server: stop it first, then start this one"
    if passed.unit == "servers":
        return (
            f"you already run {passed.in_use} of the {passed.cap} servers {name} allows each "
            "member: stop one of them first"
        )
    return (
        f"your {name} servers already hold {passed.in_use} of the "
        f"{amount(policy, passed.cap, passed.unit)} each member may use, and this server "
        f"needs {passed.need}: stop one of them first, or choose a smaller server"
    )


def too_large_reason(policy: Policy, level: Group, passed: Passed) -> str:
    """A server larger than a group may ever hold: no amount of waiting helps."""
    return (
        f"this server needs {amount(policy, passed.need, passed.unit)}, and "
        f"{level.display_name} may use at most {passed.cap} in all: choose a smaller "
        "profile or fewer GPUs"
    )


def full_reason(policy: Policy, level: Group, passed: Passed) -> str:
    """A group (or a parent) whose limit this server would pass now: what it holds."""
    return (
        f"{level.display_name} already uses {passed.in_use} of its "
        f"{amount(policy, passed.cap, passed.unit)}, and this server needs {passed.need}"
    )


#: what a spawn refused by a full group can do (one that waits is told its place)
FULL_NEXT_STEP = "try again when one of its servers stops"


class Ledger:
    def __init__(self) -> None:
        self.charges: dict[str, Charge] = {}
        self.groups: dict[str, Usage] = {}  # a parent's usage includes its children's
        self.users: dict[tuple[str, str], Usage] = {}  # (user, group) -> usage

    @classmethod
    def from_charges(cls, policy: Policy, charges: Iterable[Charge]) -> Ledger:
        ledger = cls()
        for charge in charges:
            ledger._record(policy, charge)
        return ledger

    def record(self, policy: Policy, charge: Charge) -> None:
        """Count a charge that already exists (a pod seen by a watch), without a decision."""
        if charge.key in self.charges:
            self.release(policy, charge.key)
        self._record(policy, charge)

    def usage(self, group: str) -> Usage:
        return self.groups.get(group) or Usage()

    def user_usage(self, user: str, group: str) -> Usage:
        return self.users.get((user, group)) or Usage()

    def _record(self, policy: Policy, charge: Charge, sign: int = 1) -> None:
        for name in policy.charged_groups(charge.group):
            usage = self.groups.setdefault(name, Usage())
            usage.add(charge.request, sign)
            if usage.is_zero():
                del self.groups[name]
        user = self.users.setdefault((charge.user, charge.group), Usage())
        user.add(charge.request, sign)
        if user.is_zero():
            del self.users[(charge.user, charge.group)]
        if sign > 0:
            self.charges[charge.key] = charge
        else:
            del self.charges[charge.key]

    def decide(self, policy: Policy, user: str, group: Group, request: Request) -> Decision:
        """The decision for this request now, without recording anything."""
        per_user = _exceeded(self.user_usage(user, group.name), request, group.per_user)
        if per_user:
            # waiting would not help: the user frees this by stopping a server
            return Decision(
                "refuse", reason=user_cap_reason(policy, group, per_user), kind=REFUSED_USER_CAP
            )
        tier = IN_QUOTA
        for level in policy.ancestors(group.name):
            if level.unlimited:
                continue
            # the request alone is too big for this group: no amount of waiting helps
            never = _exceeded(Usage(), request, level.limit)
            if never:
                return Decision(
                    "refuse",
                    reason=too_large_reason(policy, level, never),
                    kind=REFUSED_TOO_LARGE,
                )
            over_limit = _exceeded(self.usage(level.name), request, level.limit)
            if over_limit:
                reason = full_reason(policy, level, over_limit)
                if policy.when_full_of(group.name) == "wait":
                    return Decision(
                        "wait", reason=reason, level=level.name, kind=REFUSED_GROUP_FULL
                    )
                return Decision(
                    "refuse",
                    reason=f"{reason}: {FULL_NEXT_STEP}",
                    level=level.name,
                    kind=REFUSED_GROUP_FULL,
                )
            if _exceeded(self.usage(level.name), request, level.quota):
                tier = OVER_QUOTA
        return Decision("admit", tier=tier)

    def admit(
        self, policy: Policy, key: str, user: str, group: Group, request: Request
    ) -> Decision:
        """Check and reserve in one step.

        A key already charged is decided afresh, as if its old charge were gone; only
        an admitted decision replaces that charge. A refused or waiting decision leaves
        every charge as it was: the old one may belong to a pod that still exists.
        """
        previous = self.release(policy, key)
        decision = self.decide(policy, user, group, request)
        if decision.admitted:
            self._record(policy, Charge(key, user, group.name, request, decision.tier))
        elif previous is not None:
            self._record(policy, previous)
        return decision

    def release(self, policy: Policy, key: str) -> Charge | None:
        charge = self.charges.get(key)
        if charge is not None:
            self._record(policy, charge, sign=-1)
        return charge

    def resync(
        self, policy: Policy, live: Iterable[Charge], keep: Iterable[str] = ()
    ) -> tuple[list[str], list[str]]:
        """Bring the ledger in step with the charges on live pods.

        Charges whose pod is gone are released, and pods the ledger does not know
        (another hub replica, a pod restored from backup) are counted, except the
        keys in ``keep``: servers the hub changed since the listing was taken (a
        spawn whose pod may not exist yet, a stop that released a pod listed while
        it was terminating), which the listing is older than. Returns (added,
        released) keys.
        """
        live_charges = {c.key: c for c in live}
        protected = set(keep)
        released = [k for k in self.charges if k not in live_charges and k not in protected]
        for key in released:
            self.release(policy, key)
        added = [k for k in live_charges if k not in self.charges and k not in protected]
        for key in added:
            self._record(policy, live_charges[key])
        return added, released
