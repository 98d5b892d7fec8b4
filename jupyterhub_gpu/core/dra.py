"""Free DRA devices per flavor, from ResourceSlices, DeviceClasses and ResourceClaims.

A dra flavor's devices are the devices of the cluster's ResourceSlices that its
DeviceClass's selectors and its own ``selectors`` both accept, on nodes a pod of
the flavor could land on; allocated ones are those some ResourceClaim's
``status.allocation`` names (a claim holds its device from allocation until it
is deleted, reserved for a pod or not)::

    inventory = DraInventory(slices, classes, claims)
    dra_capacity(flavor, inventory, nodes)   # (allocatable, allocated, nodes, note)

Selectors are CEL, evaluated here for a documented subset (``CelSubset``):

- ``device.driver``, ``device.attributes['<domain>'].<name>`` (also with ``"``);
- string, integer and boolean literals, ``true`` / ``false``;
- ``==``, ``!=``, ``&&``, ``||``, ``!`` and parentheses.

An attribute a device does not have makes the comparison false (the scheduler
would stop at the error: fewer devices are counted, never more). Anything else
(``in``, functions such as ``semver()`` or ``quantity()``, ``device.capacity``,
``<``) is not evaluated: the flavor's capacity stays unknown and the note names
the expression. Partitionable devices (shared counters), consumable capacity
and device taints are not modelled: each device is one unit, free or not.

The extended-resource bridge (Kubernetes' DRAExtendedResource): a DeviceClass
with ``extendedResourceName`` (and every class, under its implicit name
``deviceclass.resource.kubernetes.io/<class>``) serves pods that ask for that
extended resource on nodes that do not advertise it; kube-scheduler makes the
pod a ResourceClaim of its own, owned by the pod. ``bridged_count`` counts those
devices for a flavor of such a resource.

What a server was allocated: the devices the allocations of the claims its pod
owns name (``pod_allocation``), and what they are worth in GPU-equivalents
(``allocated_gpus``; ``device_equivalents``): a whole GPU 1, a MIG partition its
compute slices out of 7, unless the flavor sets ``gpu_equivalents`` per device.

Pure: no I/O; objects in the API's JSON form (camelCase keys).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

Device = Mapping[str, Any]  # {"driver", "pool", "name", "node", "attributes"}
#: (driver, pool, device): what an allocation result names
DeviceKey = tuple[str, str, str]
#: the name every DeviceClass also maps, without ``extendedResourceName``
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
#: compute slices of a GPU that MIG partitions (A100, H100, H200)
MIG_SLICES = 7
Predicate = Callable[[Device], bool]


class UnsupportedCel(ValueError):
    """An expression outside the evaluated subset; the message names what."""


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
      | (?P<number>-?\d+)
      | (?P<op>==|!=|&&|\|\||[!().\[\]])
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<other>\S+)
    )""",
    re.VERBOSE,
)
_MISSING = object()


def _tokens(expression: str) -> list[tuple[str, str]]:
    tokens = []
    position = 0
    expression = expression.strip()
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:  # trailing spaces
            break
        position = match.end()
        kind = match.lastgroup or "other"
        if kind == "other":
            raise UnsupportedCel(f"{match.group(kind)!r} is not in the evaluated subset of CEL")
        tokens.append((kind, match.group(kind)))
    return tokens


class _Parser:
    """Recursive descent over the subset; builds a function of a device."""

    def __init__(self, expression: str) -> None:
        self.tokens = _tokens(expression)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        token = self.peek()
        if token is None or (value and token[1] != value) or (kind and token[0] != kind):
            want = value or kind
            found = token[1] if token else "the end"
            raise UnsupportedCel(f"expected {want}, found {found!r}")
        self.i += 1
        return token[1]

    def parse(self) -> Callable[[Device], Any]:
        value = self.or_()
        if self.peek() is not None:
            raise UnsupportedCel(f"{self.peek()[1]!r} is not in the evaluated subset of CEL")
        return value

    def or_(self) -> Callable[[Device], Any]:
        left = self.and_()
        while self.peek() == ("op", "||"):
            self.take("||")
            right, first = self.and_(), left
            left = lambda d, a=first, b=right: a(d) is True or b(d) is True  # noqa: E731
        return left

    def and_(self) -> Callable[[Device], Any]:
        left = self.compare()
        while self.peek() == ("op", "&&"):
            self.take("&&")
            right, first = self.compare(), left
            left = lambda d, a=first, b=right: a(d) is True and b(d) is True  # noqa: E731
        return left

    def compare(self) -> Callable[[Device], Any]:
        left = self.unary()
        token = self.peek()
        if token in (("op", "=="), ("op", "!=")):
            op = self.take()
            right = self.unary()

            def compare(d: Device, a=left, b=right, equal=op == "==") -> bool:
                x, y = a(d), b(d)
                if x is _MISSING or y is _MISSING:
                    return False  # the scheduler errs on a missing attribute: no match
                return (x == y and type(x) is type(y)) is equal

            return compare
        return left

    def unary(self) -> Callable[[Device], Any]:
        token = self.peek()
        if token == ("op", "!"):
            self.take("!")
            inner = self.unary()
            return lambda d: (v := inner(d)) is not _MISSING and v is False
        if token == ("op", "("):
            self.take("(")
            inner = self.or_()
            self.take(")")
            return inner
        if token is None:
            raise UnsupportedCel("the expression ends too early")
        kind, value = token
        if kind == "string":
            self.take()
            text = bytes(value[1:-1], "utf-8").decode("unicode_escape")
            return lambda d: text
        if kind == "number":
            self.take()
            number = int(value)
            return lambda d: number
        if kind == "name" and value in ("true", "false"):
            self.take()
            return (lambda d: True) if value == "true" else (lambda d: False)
        if kind == "name" and value == "device":
            return self.device_field()
        raise UnsupportedCel(f"{value!r} is not in the evaluated subset of CEL")

    def device_field(self) -> Callable[[Device], Any]:
        self.take("device")
        self.take(".")
        field_name = self.take(kind="name")
        if field_name == "driver":
            return lambda d: d["driver"]
        if field_name != "attributes":
            raise UnsupportedCel(f"device.{field_name} is not in the evaluated subset of CEL")
        self.take("[")
        domain = self.take(kind="string")[1:-1]
        self.take("]")
        self.take(".")
        name = self.take(kind="name")
        if self.peek() == ("op", "("):
            raise UnsupportedCel(f"a function call on {name!r} is not in the evaluated subset")
        return lambda d: attribute(d, domain, name)


def attribute(device: Device, domain: str, name: str) -> Any:
    """The value of ``device.attributes[domain].name``; a slice names its driver's own
    attributes unqualified, others as ``domain/name``."""
    attributes = device.get("attributes") or {}
    value = attributes.get(f"{domain}/{name}")
    if value is None and domain == device.get("driver"):
        value = attributes.get(name)
    if not isinstance(value, Mapping):
        return _MISSING
    for kind in ("string", "int", "bool"):
        if kind in value:
            return value[kind]
    return _MISSING  # a version: only comparable through semver(), not evaluated


def compile_selector(expression: str) -> Predicate:
    """A device predicate for one CEL selector; ``UnsupportedCel`` outside the subset."""
    evaluate = _Parser(expression).parse()
    return lambda device: evaluate(device) is True


@dataclass(frozen=True)
class DraInventory:
    """What the cluster's DRA objects say, in the API's JSON form."""

    slices: Iterable[Mapping[str, Any]] = ()
    classes: Iterable[Mapping[str, Any]] = ()
    claims: Iterable[Mapping[str, Any]] = ()
    #: why the DRA objects are not known (no RBAC, an old cluster); None: they are
    problem: str | None = None
    devices: list[dict[str, Any]] = field(init=False)
    allocated: set[DeviceKey] = field(init=False)
    #: a pod's uid -> the devices the claims that pod owns were allocated
    by_pod: dict[str, list[DeviceKey]] = field(init=False)

    def __post_init__(self) -> None:
        claims = list(self.claims)
        object.__setattr__(self, "claims", claims)
        object.__setattr__(self, "devices", published_devices(self.slices))
        object.__setattr__(self, "allocated", allocated_devices(claims))
        object.__setattr__(self, "by_pod", devices_by_pod(claims))

    def device(self, key: DeviceKey) -> Device | None:
        """The published device an allocation names (None: not published now)."""
        index = self.__dict__.get("_index")
        if index is None:
            index = {(d["driver"], d["pool"], d["name"]): d for d in self.devices}
            self.__dict__["_index"] = index
        return index.get(key)

    def bridge_classes(self, resource: str) -> list[str]:
        """The DeviceClasses that serve ``resource`` to pods asking for it: those whose
        ``extendedResourceName`` it is, and the class its implicit name names."""
        found = []
        for c in self.classes:
            name = (c.get("metadata") or {}).get("name") or ""
            mapped = (c.get("spec") or {}).get("extendedResourceName")
            if mapped == resource or resource == f"{IMPLICIT_PREFIX}{name}":
                found.append(name)
        return found


def published_devices(slices: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every device of the slices, of each pool's newest generation only (a driver
    republishing a pool leaves the old generation's slices behind for a moment)."""
    slices = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (spec.get("driver", ""), pool.get("name", ""))
        newest[key] = max(newest.get(key, 0), int(pool.get("generation") or 0))
    devices = []
    for s in slices:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        driver, pool_name = spec.get("driver", ""), pool.get("name", "")
        if int(pool.get("generation") or 0) != newest[(driver, pool_name)]:
            continue
        for device in spec.get("devices") or []:
            devices.append(
                {
                    "driver": driver,
                    "pool": pool_name,
                    "name": device.get("name", ""),
                    "node": spec.get("nodeName"),
                    "attributes": device.get("attributes") or {},
                }
            )
    return devices


def _results(claim: Mapping[str, Any]) -> list[DeviceKey]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        (r.get("driver", ""), r.get("pool", ""), r.get("device", ""))
        for r in (allocation.get("devices") or {}).get("results") or []
    ]


def allocated_devices(claims: Iterable[Mapping[str, Any]]) -> set[DeviceKey]:
    """(driver, pool, device) of every device some claim's allocation names."""
    return {key for claim in claims for key in _results(claim)}


def owner_pod(claim: Mapping[str, Any]) -> str | None:
    """The uid of the pod that owns a claim (a claim from a pod's ResourceClaimTemplate,
    or the one kube-scheduler makes for a pod's bridged extended resource), or None."""
    for owner in (claim.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == "Pod" and owner.get("controller"):
            return owner.get("uid")
    return None


def devices_by_pod(claims: Iterable[Mapping[str, Any]]) -> dict[str, list[DeviceKey]]:
    """A pod's uid -> the devices allocated to the claims that pod owns."""
    by_pod: dict[str, list[DeviceKey]] = {}
    for claim in claims:
        pod = owner_pod(claim)
        if pod is not None:
            by_pod.setdefault(pod, []).extend(_results(claim))
    return by_pod


def flavor_predicate(
    device_class: str | None, selectors: Iterable[str], classes: Iterable[Mapping[str, Any]]
) -> Predicate:
    """The DeviceClass's selectors and the flavor's, all of which a device must pass.

    Raises ``UnsupportedCel`` for an expression outside the subset and ``LookupError``
    when the DeviceClass does not exist."""
    found = [c for c in classes if (c.get("metadata") or {}).get("name") == device_class]
    if not found:
        raise LookupError(f"DeviceClass {device_class!r} does not exist in the cluster")
    expressions = [
        (s.get("cel") or {}).get("expression", "")
        for s in (found[0].get("spec") or {}).get("selectors") or []
    ]
    predicates = []
    for expression in [*expressions, *selectors]:
        try:
            predicates.append(compile_selector(expression))
        except UnsupportedCel as e:
            raise UnsupportedCel(f"selector {expression!r} not evaluated: {e}") from None
    return lambda device: all(p(device) for p in predicates)


@dataclass(frozen=True)
class DraCount:
    allocatable: int | None
    allocated: int | None
    nodes: int
    note: str


def dra_count(
    device_class: str | None,
    selectors: Iterable[str],
    inventory: DraInventory,
    node_ok: Callable[[str], bool],
) -> DraCount:
    """Devices a flavor's claim could get, and how many of them claims hold.

    ``node_ok(name)``: whether a pod of the flavor could land on that node (usable,
    selected, taints tolerated). Devices of slices with no node name (devices any
    node reaches) are counted whatever the node."""
    if inventory.problem is not None:
        return DraCount(None, None, 0, f"DRA devices unknown: {inventory.problem}")
    try:
        accepts = flavor_predicate(device_class, selectors, inventory.classes)
    except (UnsupportedCel, LookupError) as e:
        return DraCount(None, None, 0, f"DRA devices unknown: {e}")
    total = used = 0
    nodes: set[str] = set()
    for device in inventory.devices:
        node = device["node"]
        if node is not None and not node_ok(node):
            continue
        if not accepts(device):
            continue
        total += 1
        if node is not None:
            nodes.add(node)
        if (device["driver"], device["pool"], device["name"]) in inventory.allocated:
            used += 1
    return DraCount(total, used, len(nodes), "devices published in ResourceSlices")


def bridged_count(
    resource: str, inventory: DraInventory, node_ok: Callable[[str], bool]
) -> DraCount | None:
    """The devices kube-scheduler could give a pod asking for the extended resource
    ``resource`` on the nodes ``node_ok`` accepts (those that do not advertise it,
    where a pod of the flavor may land), and how many are allocated; None when no
    DeviceClass maps it."""
    if inventory.problem is not None:
        return None
    classes = inventory.bridge_classes(resource)
    if not classes:
        return None
    counts = [dra_count(c, (), inventory, node_ok) for c in classes]
    unknown = [c.note for c in counts if c.allocatable is None]
    if unknown:
        return DraCount(None, None, 0, unknown[0])
    return DraCount(
        sum(c.allocatable or 0 for c in counts),
        sum(c.allocated or 0 for c in counts),
        sum(c.nodes for c in counts),
        f"through DeviceClass {', '.join(classes)} (DRA)",
    )


def device_equivalents(device: Device | None) -> Fraction | None:
    """GPU-equivalents of one published device as NVIDIA's driver describes it: a whole
    GPU (``type: gpu``) 1, a MIG partition (``type: mig``, ``profile: 3g.40gb``) its
    compute slices out of 7; None for anything else."""
    if device is None:
        return None
    kind = attribute(device, device.get("driver", ""), "type")
    if kind == "gpu":
        return Fraction(1)
    if kind == "mig":
        profile = attribute(device, device.get("driver", ""), "profile")
        if isinstance(profile, str) and (slices := profile.split("g.", 1)[0]).isdigit():
            return min(Fraction(int(slices), MIG_SLICES), Fraction(1))
    return None


@dataclass(frozen=True)
class Allocation:
    """What a pod's claims were allocated, in GPU-equivalents, and in words."""

    devices: tuple[DeviceKey, ...]
    gpus: Fraction
    words: tuple[str, ...]


def pod_allocation(
    inventory: DraInventory, pod_uid: str, per_device: Fraction | None = None
) -> Allocation | None:
    """The devices the claims of the pod ``pod_uid`` were allocated and their worth:
    ``per_device`` each (a flavor's ``gpu_equivalents``) or, without it, what each
    device is (``device_equivalents``; a device of unknown kind counts 1). None:
    no allocated claim of that pod is known."""
    keys = tuple(inventory.by_pod.get(pod_uid, ()))
    if not keys:
        return None
    total = Fraction(0)
    words = []
    for key in keys:
        device = inventory.device(key)
        worth = per_device or device_equivalents(device) or Fraction(1)
        total += worth
        words.append(device_words(key, device))
    return Allocation(keys, total, tuple(words))


def allocated_gpus(
    inventory: DraInventory, pod_uid: str, per_device: Fraction | None = None
) -> Fraction | None:
    """GPU-equivalents the claims of the pod ``pod_uid`` hold (``pod_allocation``), or
    None where that is not known: no allocated claim of the pod, or DRA unreadable."""
    if inventory.problem is not None:
        return None
    allocation = pod_allocation(inventory, pod_uid, per_device)
    return allocation.gpus if allocation is not None else None


def device_words(key: DeviceKey, device: Device | None) -> str:
    """``gpu-1 (NVIDIA H200 NVL) on h200-dra-0``; a MIG partition names its profile."""
    driver, pool, name = key
    if device is None:
        return f"{name} of {driver} pool {pool}"
    product = attribute(device, driver, "productName")
    profile = attribute(device, driver, "profile")
    what = [p for p in (product, profile) if isinstance(p, str)]
    shown = f"{name} ({' '.join(what)})" if what else name
    return f"{shown} on {device['node']}" if device.get("node") else shown
