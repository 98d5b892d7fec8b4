"""What a user may choose, and what they chose: offers and server-side validation.

``offers`` lists one entry per (group, profile) pair the user's groups and
``everyone`` allow, slug ``<group>--<profile>``, with options already bounded by
the group's and the user's caps. ``select`` checks ``user_options`` (from the
form or a direct REST call) against those offers and turns them into a
``Selection`` with the exact ``Request`` admission charges; anything unknown,
forbidden, out of bounds or forged raises ``Refused`` with a one-line reason
(``Malformed``, a kind of ``Refused``, when a value is of the wrong JSON type).
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .model import Flavor, Group, Interface, Option, Policy, Profile

#: Kinds where a server gets one share of a GPU, whatever the gpus option says.
SHARED_KINDS = ("timeslice", "mps", "fraction")


#: the options a form sends beside ``profile``
CHOICES = ("gpus", "flavor", "image", "interface")
#: what KubeSpawner's form sends for a typed-in image (``unlisted_choice``)
UNLISTED_IMAGE = "image--unlisted-choice"
#: longer than any image reference a registry accepts; never matched against the regex
MAX_IMAGE_LENGTH = 1000


class Refused(Exception):
    """The spawn is refused; the message is what the user sees."""


class Malformed(Refused):
    """The options are not of the form's shape: a value of the wrong JSON type, or a
    body that is not an object. The request is bad (HTTP 400), rather than forbidden."""


#: at most this much of any user input is quoted back in a refusal
ECHO_LIMIT = 100


def shown(value: Any) -> str:
    """User input as a refusal quotes it: repr, one line, at most ``ECHO_LIMIT`` characters."""
    text = repr(value) if isinstance(value, str) else _kind_of(value)
    return text if len(text) <= ECHO_LIMIT else f"{text[: ECHO_LIMIT - 1]}…"


def _kind_of(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


@dataclass(frozen=True)
class Request:
    """What one server is charged: GPU-equivalents, units per flavor, CPU, memory, one server."""

    gpus: Fraction = Fraction(0)
    cpu: int = 0  # millicores
    memory: int = 0  # bytes
    servers: int = 1
    devices: tuple[tuple[str, int], ...] = ()  # (flavor, units)

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": str(self.gpus),
            "cpu": self.cpu,
            "memory": self.memory,
            "servers": self.servers,
            "devices": dict(self.devices),
        }

    @property
    def flavors(self) -> dict[str, int]:
        """Device units per flavor (``Totals``, as a usage has them)."""
        return dict(self.devices)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Request:
        return cls(
            gpus=Fraction(data["gpus"]),
            cpu=int(data["cpu"]),
            memory=int(data["memory"]),
            servers=int(data.get("servers", 1)),
            devices=tuple(sorted((str(k), int(v)) for k, v in data.get("devices", {}).items())),
        )


@dataclass(frozen=True)
class Offer:
    group: Group
    profile: Profile
    options: Mapping[str, Option]  # bounded by the caps
    #: what its servers can open (empty: the policy names no interfaces); the first
    #: is the default
    interfaces: tuple[Interface, ...] = ()

    @property
    def slug(self) -> str:
        return f"{self.group.name}--{self.profile.name}"


@dataclass(frozen=True)
class Selection:
    group: Group
    profile: Profile
    flavor: Flavor | None
    count: int
    image: str | None
    request: Request
    #: the options as the form would send them (choice keys, strings): what
    #: KubeSpawner's own profile handling is given instead of the raw input
    options: Mapping[str, str] = field(default_factory=dict)
    #: what the server opens (None: the policy names no interfaces)
    interface: Interface | None = None

    @property
    def slug(self) -> str:
        return f"{self.group.name}--{self.profile.name}"

    @property
    def user_options(self) -> dict[str, str]:
        return {"profile": self.slug, **self.options}


def request_for(profile: Profile, flavor: Flavor | None, count: int) -> Request:
    if flavor is None:
        return Request(cpu=profile.cpu, memory=profile.memory)
    return Request(
        gpus=flavor.unit_equivalents * count,
        cpu=profile.cpu,
        memory=profile.memory,
        devices=((flavor.name, count),),
    )


def units_per_server(flavor: Flavor, count: int) -> int:
    """The units of ``flavor`` a server asking for ``count`` takes: a shared replica
    or slice is one per server (the device plugin's failRequestsGreaterThanOne);
    more replicas would not add a GPU."""
    return 1 if flavor.kind in SHARED_KINDS else count


def base_request(policy: Policy, profile: Profile) -> Request:
    """What a profile is charged with its own defaults (no options chosen)."""
    if profile.gpu is None:
        return request_for(profile, None, 0)
    return request_for(profile, policy.flavors[profile.gpu.flavor], profile.gpu.count)


def _fits_caps(policy: Policy, group: Group, request: Request) -> bool:
    """Could this request ever be admitted in this group (empty cluster, no other servers)?"""
    for level in policy.ancestors(group.name):
        if level.unlimited:
            continue
        for caps in (level.limit, *((group.per_user,) if level is group else ())):
            if caps.first_passed(request) is not None:
                return False
    return True


def _bounded_options(policy: Policy, group: Group, profile: Profile) -> dict[str, Option]:
    """The profile's options without the choices the group's or user's caps can never admit."""
    options: dict[str, Option] = {}
    base_flavor = policy.flavors[profile.gpu.flavor] if profile.gpu else None
    for name, option in profile.options.items():
        kept = []
        for key, value in option.choices:
            if name == "gpus":
                request = request_for(profile, base_flavor, value)
            elif name == "flavor":
                flavor = policy.flavors[value]
                request = request_for(profile, flavor, units_per_server(flavor, profile.gpu.count))
            else:
                request = base_request(policy, profile)
            if _fits_caps(policy, group, request):
                kept.append((key, value))
        if kept:
            options[name] = Option(
                option.name,
                option.display_name,
                tuple(kept),
                option.unlisted_regex,
                option.unlisted_display_name,
            )
    return options


def member_groups(policy: Policy, user_groups: Iterable[str]) -> list[Group]:
    """The policy groups a user belongs to (in policy order), then everyone."""
    order = policy.group_order
    names = sorted({n for n in user_groups if n in order}, key=order.__getitem__)
    return [policy.groups[n] for n in names] + [policy.everyone]


def offers(policy: Policy, user_groups: Iterable[str]) -> list[Offer]:
    result = []
    for group in member_groups(policy, user_groups):
        for name in group.profiles:
            offer = _group_offer(policy, group, name)
            if offer is not None:
                result.append(offer)
    return result


def _group_offer(policy: Policy, group: Group, name: str) -> Offer | None:
    """A group's offer of one profile, None when its caps can never admit it (e.g. a GPU
    profile in a group whose quota is 0). It depends on the policy alone, not on live
    usage, so it is computed once per policy: each spawn lists and selects offers,
    and recomputing every choice's request and caps was most of the spawn path's time."""
    key = (group.name, name)
    if key not in policy.offer_cache:
        profile = policy.profiles[name]
        options = _bounded_options(policy, group, profile)
        fits = _fits_caps(policy, group, base_request(policy, profile))
        interfaces = policy.interfaces_of(group, profile)
        offered = fits or options
        policy.offer_cache[key] = Offer(group, profile, options, interfaces) if offered else None
    return policy.offer_cache[key]


def _choice_key(name: str, raw: Any) -> str:
    """The choice a form would send for ``raw``: a string, or a whole number as JSON
    gives it (``"gpus": 1`` is the choice ``"1"``); anything else is refused."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw)
    if isinstance(raw, float) and raw.is_integer() and abs(raw) < 2**53:
        return str(int(raw))
    raise Malformed(f"{name}: expected one of the form's choices, got {shown(raw)}")


def _choice(offer: Offer, name: str, raw: Any, default: Any) -> tuple[Any, str | None]:
    """The chosen value and its choice key (None: the default, nothing chosen)."""
    option = offer.profile.options.get(name)
    if raw is None:
        return default, None
    if option is None:
        raise Refused(f"profile {offer.slug} has no {shown(name)} option")
    chosen = _choice_key(name, raw)
    bounded = offer.options.get(name)
    for key, value in option.choices:
        if chosen == key:
            if bounded is None or key not in dict(bounded.choices):
                raise Refused(
                    f"{name}={key} is more than {offer.group.display_name} allows for "
                    f"{offer.profile.display_name}: choose another"
                )
            return value, key
    allowed = ", ".join(k for k, _ in (bounded or option).choices)
    raise Refused(
        f"{name}={shown(chosen)} is not a choice of {offer.slug}: choose one of {allowed}"
    )


def _interface(offer: Offer, raw: Any) -> tuple[Interface | None, str | None]:
    """What the server opens, and the choice key the form sends for it (None where
    the form has no choice to make: one interface, or the default)."""
    if raw is None:
        return (offer.interfaces[0] if offer.interfaces else None), None
    if not offer.interfaces:
        raise Refused(f"profile {offer.slug} has no 'interface' option")
    chosen = _choice_key("interface", raw)
    for interface in offer.interfaces:
        if interface.name == chosen:
            return interface, (chosen if len(offer.interfaces) > 1 else None)
    offered = ", ".join(i.name for i in offer.interfaces)
    raise Refused(
        f"interface {shown(chosen)} is not offered with {offer.slug} (offered: {offered})"
    )


def _unlisted_image(offer: Offer, image: Any) -> str:
    if not isinstance(image, str):
        raise Malformed(f"{UNLISTED_IMAGE}: expected an image name, got {shown(image)}")
    option = offer.profile.options["image"]
    if option.unlisted_regex is None:
        raise Refused(f"profile {offer.slug} offers only its listed images")
    if len(image) > MAX_IMAGE_LENGTH or not re.fullmatch(option.unlisted_regex, image):
        raise Refused(
            f"image {shown(image)} is not allowed here: it must match {option.unlisted_regex}"
        )
    return image


def select(policy: Policy, user_groups: Iterable[str], user_options: Any) -> Selection:
    """Validate ``user_options`` server-side; the result is what will be charged and shaped.

    ``user_options`` is whatever the form or a REST request sent (None: nothing);
    anything but an object of the form's choices is refused with one line.
    """
    available = offers(policy, user_groups)
    if not available:
        raise Refused("you are not offered any server: ask an admin to add you to a group")
    if user_options is not None and not isinstance(user_options, Mapping):
        raise Malformed(f"server options must be a JSON object, got {shown(user_options)}")
    options = dict(user_options or {})  # None or an empty object: the defaults
    slug = options.pop("profile", None)
    if slug is None or slug == "":
        chosen = next((o for o in available if o.profile.default), available[0])
    elif not isinstance(slug, str):
        raise Malformed(f"profile: expected a profile's name, got {shown(slug)}")
    else:
        chosen = next((o for o in available if o.slug == slug), None)
        if chosen is None:
            raise Refused(
                f"profile {shown(slug)} is not offered to you: choose one the spawn form shows"
            )
    forged = sorted(str(k) for k in options if k not in (*CHOICES, UNLISTED_IMAGE))
    if forged:
        raise Refused(f"unknown option {shown(forged[0])}: only the form's choices are accepted")
    interface, key = _interface(chosen, options.pop("interface", None))
    canonical: dict[str, str] = {"interface": key} if key is not None else {}
    profile = chosen.profile
    for name in options:
        if name.removesuffix("--unlisted-choice") not in profile.options:
            raise Refused(f"profile {chosen.slug} has no {shown(name)} option")
    flavor = None
    count = 0
    if profile.gpu:
        flavor_name, key = _choice(chosen, "flavor", options.get("flavor"), profile.gpu.flavor)
        canonical.update({"flavor": key} if key is not None else {})
        flavor = policy.flavors[flavor_name]
        count, key = _choice(chosen, "gpus", options.get("gpus"), profile.gpu.count)
        canonical.update({"gpus": key} if key is not None else {})
        count = units_per_server(flavor, count)
    if options.get(UNLISTED_IMAGE):
        image = canonical[UNLISTED_IMAGE] = _unlisted_image(chosen, options[UNLISTED_IMAGE])
    else:
        image, key = _choice(chosen, "image", options.get("image"), profile.image)
        canonical.update({"image": key} if key is not None else {})
    request = request_for(profile, flavor, count)
    if not _fits_caps(policy, chosen.group, request):
        raise Refused(
            f"{profile.display_name} with {count} x {flavor.display_name if flavor else 'CPU'} "
            f"is more than {chosen.group.display_name} allows: choose fewer GPUs or another "
            "profile"
        )
    return Selection(chosen.group, profile, flavor, count, image, request, canonical, interface)
