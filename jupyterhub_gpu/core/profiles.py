"""The profile list entries a user is offered: pure, from the policy, the ledger and
the free capacity, in KubeSpawner's ``profile_list`` form (which the stock form and
jupyterhub-fancy-profiles both read)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .admission import Ledger
from .budgets import BudgetState, format_cap, format_hours, format_period
from .capacity import FlavorCapacity
from .model import Option, Policy
from .quantities import format_gpus
from .selection import Offer


def profile_entry(
    policy: Policy,
    ledger: Ledger,
    offer: Offer,
    capacity: Mapping[str, FlavorCapacity] | None = None,
    budgets: Sequence[BudgetState] = (),
) -> dict[str, Any]:
    """One KubeSpawner profile_list entry: resources, the group's live remaining quota
    and GPU-hour budgets (``budgets``, for GPU profiles), and the free cluster
    capacity of its flavor (``capacity`` None: unknown)."""
    group, profile = offer.group, offer.profile
    lines = [profile.description] if profile.description else []
    resources = f"{_cores(profile.cpu)} CPU, {profile.memory / 2**30:g} GiB RAM"
    if profile.gpu:
        flavor = policy.flavors[profile.gpu.flavor]
        resources += f", {profile.gpu.count} x {flavor.display_name}"
    lines.append(resources)
    if not group.unlimited and group.limit.gpus is not None:
        used = ledger.usage(group.name).gpus
        free = max(group.limit.gpus - used, 0)
        lines.append(
            f"{group.display_name}: {format_gpus(free)} of {format_gpus(group.limit.gpus)} "
            "GPUs free"
        )
    if profile.gpu:
        lines.extend(budget_line(state) for state in budgets)
        lines.append(capacity_line(capacity, profile.gpu.flavor))
    entry: dict[str, Any] = {
        "display_name": f"{group.display_name}: {profile.display_name}",
        "slug": offer.slug,
        "description": " · ".join(lines),
        "default": profile.default,
        "kubespawner_override": dict(profile.kubespawner_override),
    }
    if offer.options:
        entry["profile_options"] = {
            name: profile_option(option) for name, option in offer.options.items()
        }
    return entry


def without_overrides(value: Any) -> Any:
    """A copy of a ``profile_list`` (or any part of one) without ``kubespawner_override``
    at any level: profile, option choice or unlisted choice. Images, volumes and
    environment are the admin's settings, not the user's to read."""
    if isinstance(value, Mapping):
        return {k: without_overrides(v) for k, v in value.items() if k != "kubespawner_override"}
    if isinstance(value, list):
        return [without_overrides(v) for v in value]
    return value


def profile_option(option: Option) -> dict[str, Any]:
    """A KubeSpawner ``profile_options`` entry; the values stay the policy's, server-side."""
    entry: dict[str, Any] = {
        "display_name": option.display_name,
        "choices": {key: {"display_name": key} for key, _ in option.choices},
    }
    if option.unlisted_regex is not None:
        entry["unlisted_choice"] = {
            "enabled": True,
            "display_name": option.unlisted_display_name,
            "validation_regex": option.unlisted_regex,
            # the image is set from the validated selection, not by an override
            "kubespawner_override": {},
        }
    return entry


def budget_line(state: BudgetState) -> str:
    """``Alpha Lab: 12.5 of 100 GPU-hours left (last 7 days)``, or that it is used up."""
    cap = format_cap(float(state.budget.gpu_hours))
    window = format_period(state.budget.period)
    if state.exhausted:
        return f"{state.owner}: all {cap} GPU-hours of the last {window} used"
    return f"{state.owner}: {format_hours(state.remaining)} of {cap} GPU-hours left (last {window})"


def capacity_line(capacity: Mapping[str, FlavorCapacity] | None, flavor: str) -> str:
    known = capacity.get(flavor) if capacity is not None else None
    if known is None or known.free is None:
        return "cluster capacity unknown"
    return f"cluster: {known.free} of {known.allocatable} {known.unit} free"


def _cores(millicores: int) -> str:
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores / 1000:g}"
