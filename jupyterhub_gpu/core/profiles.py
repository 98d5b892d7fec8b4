"""The profile list entries a user is offered: pure, from the policy, the ledger and
the free capacity, in KubeSpawner's ``profile_list`` form (which the stock form and
jupyterhub-fancy-profiles both read)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from . import words
from .admission import Ledger
from .budgets import BudgetState, amount_words
from .capacity import FlavorCapacity
from .model import Dataset, Group, Option, Policy
from .quantities import format_gpus
from .selection import Offer, Request, base_request, request_for, units_per_server


def profile_entry(
    policy: Policy,
    ledger: Ledger,
    offer: Offer,
    capacity: Mapping[str, FlavorCapacity] | None = None,
    budgets: Sequence[BudgetState] = (),
    usable_again: float | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """One KubeSpawner profile_list entry: resources, the group's live remaining quota
    (what ``user`` could really start now: ``room_line``) and GPU-hour budgets
    (``budgets``, for GPU profiles), and the free cluster capacity of its flavor
    (``capacity`` None: unknown).

    A GPU profile with a used-up budget is ``disabled`` (a key of ours, which the
    spawner's form script reads) and never the default; ``usable_again``: when each
    used-up budget has room again (None: not known)."""
    group, profile = offer.group, offer.profile
    used_up = bool(profile.gpu) and any(state.exhausted for state in budgets)
    lines = [profile.description] if profile.description else []
    if used_up:
        lines.insert(0, used_up_line(usable_again))
    resources = f"{_cores(profile.cpu)} CPU, {profile.memory / 2**30:g} GiB RAM"
    if profile.gpu:
        flavor = policy.flavors[profile.gpu.flavor]
        resources += f", {profile.gpu.count} x {flavor.display_name}"
    lines.append(resources)
    room = room_line(policy, ledger, offer, user)
    if room:
        lines.append(room)
    if profile.gpu:
        lines.extend(budget_line(state) for state in budgets)
        lines.append(capacity_line(capacity, profile.gpu.flavor))
    datasets = policy.datasets_of(group.name)
    if datasets:
        lines.append("data: " + ", ".join(dataset_words(d) for d in datasets))
    entry: dict[str, Any] = {
        "display_name": f"{group.display_name}: {profile.display_name}",
        "slug": offer.slug,
        "description": " · ".join(lines),
        "default": profile.default and not used_up,
        "kubespawner_override": dict(profile.kubespawner_override),
    }
    if used_up:
        entry["display_name"] += " (GPU-hours used up)"
        entry["disabled"] = True
    if offer.options:
        entry["profile_options"] = {
            name: profile_option(option) for name, option in offer.options.items()
        }
    if len(offer.interfaces) > 1:
        entry.setdefault("profile_options", {})["interface"] = {
            "display_name": "Open",
            "choices": {
                i.name: {"display_name": i.display_name, "default": n == 0}
                for n, i in enumerate(offer.interfaces)
            },
        }
    return entry


def dataset_words(dataset: Dataset) -> str:
    """``ImageNet at /data/imagenet (read-only)``."""
    read_only = " (read-only)" if dataset.read_only else ""
    return f"{dataset.display_name} at {dataset.mount_path}{read_only}"


def used_up_line(usable_again: float | None) -> str:
    """What a used-up GPU profile says first: when it can be started again."""
    if usable_again is None:
        return "Not available: its GPU-hours are used up"
    return f"Not available until {words.moment(usable_again)}: its GPU-hours are used up"


def with_usable_default(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` with a default that can be started: the policy's default while
    it is usable, otherwise the first usable entry (KubeSpawner would otherwise
    make the first entry the default, used up or not)."""
    usable = [e for e in entries if not e.get("disabled")]
    if usable and not any(e.get("default") for e in usable):
        usable[0]["default"] = True
    return entries


def disabled_slugs(profile_list: Any) -> list[str]:
    """The slugs of the entries ``profile_entry`` marked disabled."""
    if not isinstance(profile_list, list):
        return []
    return [str(e["slug"]) for e in profile_list if isinstance(e, Mapping) and e.get("disabled")]


#: disables the used-up entries in either form a site uses: KubeSpawner's own (a radio
#: ``profile-item-<slug>`` in a label) and jupyterhub-fancy-profiles' (a radio
#: ``profile-option-<slug>`` in a clickable ``profile-<slug>`` card, drawn by React
#: after the page loads, and drawn again as the user clicks: hence the observer)
_DISABLE_SCRIPT = """<script>
(function () {
  var slugs = %s;
  function disable() {
    slugs.forEach(function (slug) {
      ["profile-item-", "profile-option-"].forEach(function (prefix) {
        var input = document.getElementById(prefix + slug);
        if (input && !input.disabled) { input.disabled = true; input.checked = false; }
      });
      var cards = [document.getElementById("profile-" + slug)];
      document.querySelectorAll("label[for]").forEach(function (label) {
        if (label.htmlFor === "profile-item-" + slug) cards.push(label);
      });
      cards.forEach(function (card) {
        if (card && card.getAttribute("aria-disabled") !== "true") {
          card.setAttribute("aria-disabled", "true");
          card.style.opacity = "0.55";
          card.style.pointerEvents = "none";
        }
      });
    });
  }
  disable();
  document.addEventListener("DOMContentLoaded", disable);
  new MutationObserver(disable).observe(document.documentElement, {childList: true, subtree: true});
})();
</script>"""


def disabling_script(slugs: Sequence[str]) -> str:
    """The script a rendered form ends with that disables the ``slugs`` entries."""
    if not slugs:
        return ""
    # JSON inside <script>: "<" escaped so that no slug can close the element
    return _DISABLE_SCRIPT % json.dumps(list(slugs)).replace("<", "\\u003c")


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
    """``Alpha Lab: 12.5 of 100 GPU-hours left in the last 7 days``, or that it is used up."""
    window = words.period(state.budget.period)
    cap = state.budget.amount
    if state.exhausted:
        return f"{state.owner}: all {amount_words(cap, state.budget)} of the last {window} used"
    left, whole = words.numbers([state.remaining, cap])
    unit = words.budget_measure(state.budget.in_units, whole)
    return f"{state.owner}: {left} of {whole} {unit} left in the last {window}"


def room_line(policy: Policy, ledger: Ledger, offer: Offer, user: str | None = None) -> str | None:
    """The group's GPUs free under its limit (None: no GPU limit), as far as a server of
    this profile could really use them now: when memory, CPU, servers or a parent's
    limit (or ``user``'s own caps) leave room for fewer of its servers than the free
    GPUs would, what they leave, and which binds."""
    group, profile = offer.group, offer.profile
    if group.unlimited or group.limit.gpus is None:
        return None
    limit = group.limit.gpus
    free = max(limit - ledger.usage(group.name).gpus, 0)
    of_limit = words.gpus(limit)  # "of 1 GPU", "of 4 GPUs"
    line = f"{group.display_name}: {format_gpus(free)} of {of_limit} free"
    request = base_request(policy, profile)
    if not request.gpus:
        return line
    binding = _tightest(policy, ledger, group, user, request, _most_gpus(policy, offer))
    if binding is None or binding[0] >= free:
        return line
    usable, why = binding
    return f"{group.display_name}: {format_gpus(usable)} of {of_limit} usable now, as {why}"


def _most_gpus(policy: Policy, offer: Offer) -> Fraction:
    """The GPU-equivalents of the largest server the offer's options allow."""
    profile = offer.profile
    assert profile.gpu is not None
    flavors = [policy.flavors[profile.gpu.flavor]]
    if "flavor" in offer.options:
        flavors = [policy.flavors[name] for _, name in offer.options["flavor"].choices]
    counts = [profile.gpu.count]
    if "gpus" in offer.options:
        counts = [count for _, count in offer.options["gpus"].choices]
    return max(
        request_for(profile, flavor, units_per_server(flavor, count)).gpus
        for flavor in flavors
        for count in counts
    )


_CAP_WORDS = {"CPUs": "CPU", "memory": "memory", "servers": "server"}


def _tightest(
    policy: Policy,
    ledger: Ledger,
    group: Group,
    user: str | None,
    request: Request,
    most: Fraction,
) -> tuple[Fraction, str] | None:
    """The GPUs the tightest cap other than the group's own GPU limit lets servers like
    ``request`` (each taking up to ``most`` GPUs) use now, and why in words (None: no
    such cap). CPU, memory and servers fit a number of servers; a parent's GPU limit
    and the user's own leave a number of GPUs."""
    found: tuple[Fraction, str] | None = None
    levels = [
        (level.limit, ledger.usage(level.name), f"the {{}} limit of {level.display_name}")
        for level in policy.ancestors(group.name)
        if not level.unlimited
    ]
    if user is not None:
        usage = ledger.user_usage(user, group.name)
        levels.append((group.per_user, usage, f"your own {{}} limit in {group.display_name}"))
    for n, (caps, used, words_for) in enumerate(levels):
        dims = [
            ("CPUs", caps.cpu, used.cpu, request.cpu),
            ("memory", caps.memory, used.memory, request.memory),
            ("servers", caps.servers, used.servers, request.servers),
        ]
        for unit, cap, held, need in dims:
            if cap is None or not need:
                continue
            fits = max(int((cap - held) // need), 0)
            if found is None or fits * most < found[0]:
                more = words.count(fits, "more server") if fits else "no more servers"
                why = f"{words_for.format(_CAP_WORDS[unit])} leaves room for {more} like this"
                found = (fits * most, why)
        # a parent's GPU limit, or the user's own
        if n > 0 and caps.gpus is not None:
            left = max(caps.gpus - used.gpus, Fraction(0))
            if found is None or left < found[0]:
                leaves = words.gpus(left) if left else "no GPUs"
                found = (left, f"{words_for.format('GPU')} leaves {leaves}")
    return found


def capacity_line(capacity: Mapping[str, FlavorCapacity] | None, flavor: str) -> str:
    known = capacity.get(flavor) if capacity is not None else None
    if known is None or known.free is None:
        return "cluster capacity unknown"
    whole = words.count(known.allocatable, known.one_unit, known.unit)
    return f"cluster: {known.free} of {whole} free"


def _cores(millicores: int) -> str:
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores / 1000:g}"
