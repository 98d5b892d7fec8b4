"""What a user may choose, and what they chose: offers and server-side validation.

``offers`` lists one entry per (group, profile) pair the user's groups and
``everyone`` allow, slug ``<group>--<profile>``, with options already bounded by
the group's and the user's caps. ``select`` checks ``user_options`` (from the
form or a direct REST call) against those offers and turns them into a
``Selection`` with the exact ``Request`` admission charges; anything unknown,
forbidden, out of bounds or forged raises ``Refused`` with a one-line reason.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .model import Flavor, Group, Option, Policy, Profile

#: Kinds where a server gets one share of a GPU, whatever the gpus option says.
SHARED_KINDS = ("timeslice", "mps", "fraction")


#: what KubeSpawner's form sends for a typed-in image (``unlisted_choice``)
UNLISTED_IMAGE = "image--unlisted-choice"


class Refused(Exception):
    """The spawn is refused; the message is what the user sees."""


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

    @property
    def slug(self) -> str:
        return f"{self.group.name}--{self.profile.name}"


def request_for(profile: Profile, flavor: Flavor | None, count: int) -> Request:
    if flavor is None:
        return Request(cpu=profile.cpu, memory=profile.memory)
    return Request(
        gpus=flavor.unit_equivalents * count,
        cpu=profile.cpu,
        memory=profile.memory,
        devices=((flavor.name, count),),
    )


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
            if caps.gpus is not None and request.gpus > caps.gpus:
                return False
            if caps.cpu is not None and request.cpu > caps.cpu:
                return False
            if caps.memory is not None and request.memory > caps.memory:
                return False
            for flavor, units in request.devices:
                if flavor in caps.flavors and units > caps.flavors[flavor]:
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
                count = 1 if flavor.kind in SHARED_KINDS else profile.gpu.count
                request = request_for(profile, flavor, count)
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
    names = set(user_groups)
    return [g for g in policy.groups.values() if g.name in names] + [policy.everyone]


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
        policy.offer_cache[key] = Offer(group, profile, options) if fits or options else None
    return policy.offer_cache[key]


def _choice(offer: Offer, name: str, raw: Any, default: Any) -> Any:
    option = offer.profile.options.get(name)
    if raw is None:
        return default
    if option is None:
        raise Refused(f"profile {offer.slug} has no {name!r} option")
    bounded = offer.options.get(name)
    for key, value in option.choices:
        if str(raw) == key:
            if bounded is None or key not in dict(bounded.choices):
                raise Refused(
                    f"{name}={raw} is more than {offer.group.display_name} allows for "
                    f"{offer.profile.display_name}"
                )
            return value
    allowed = ", ".join(k for k, _ in (bounded or option).choices)
    raise Refused(f"{name}={raw!r} is not a choice of {offer.slug} (choices: {allowed})")


def _unlisted_image(offer: Offer, image: str) -> str:
    option = offer.profile.options["image"]
    if option.unlisted_regex is None:
        raise Refused(f"profile {offer.slug} offers only its listed images")
    if not re.fullmatch(option.unlisted_regex, image):
        raise Refused(f"image {image!r} is not allowed here: it must match {option.unlisted_regex}")
    return image


def select(
    policy: Policy, user_groups: Iterable[str], user_options: Mapping[str, Any]
) -> Selection:
    """Validate ``user_options`` server-side; the result is what will be charged and shaped."""
    available = offers(policy, user_groups)
    if not available:
        raise Refused("you are not offered any server: ask an admin to add you to a group")
    options = dict(user_options or {})
    slug = options.pop("profile", None)
    if slug is None:
        chosen = next((o for o in available if o.profile.default), available[0])
    else:
        chosen = next((o for o in available if o.slug == slug), None)
        if chosen is None:
            raise Refused(f"profile {slug!r} is not offered to you")
    forged = sorted(k for k in options if k not in ("gpus", "flavor", "image", UNLISTED_IMAGE))
    if forged:
        raise Refused(f"unknown option {forged[0]!r}: only the form's choices are accepted")
    profile = chosen.profile
    for name in options:
        if name.removesuffix("--unlisted-choice") not in profile.options:
            raise Refused(f"profile {chosen.slug} has no {name!r} option")
    flavor = None
    count = 0
    if profile.gpu:
        flavor_name = _choice(chosen, "flavor", options.get("flavor"), profile.gpu.flavor)
        flavor = policy.flavors[flavor_name]
        count = _choice(chosen, "gpus", options.get("gpus"), profile.gpu.count)
        if flavor.kind in SHARED_KINDS:
            # a shared replica or slice is one per server (the device plugin's
            # failRequestsGreaterThanOne); more replicas would not add a GPU
            count = 1
    if options.get(UNLISTED_IMAGE):
        image = _unlisted_image(chosen, str(options[UNLISTED_IMAGE]))
    else:
        image = _choice(chosen, "image", options.get("image"), profile.image)
    request = request_for(profile, flavor, count)
    if not _fits_caps(policy, chosen.group, request):
        raise Refused(
            f"{profile.display_name} with {count} x {flavor.display_name if flavor else 'CPU'} "
            f"is more than {chosen.group.display_name} allows"
        )
    return Selection(chosen.group, profile, flavor, count, image, request)
