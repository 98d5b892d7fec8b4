"""The policy model: what the admin wrote under ``hub.config.GPUPolicy``, checked.

``parse_policy`` turns the raw mappings (as YAML gives them) into frozen
dataclasses, or raises ``PolicyError`` listing *every* problem, each with its
full key path and what to write instead::

    hub.config.GPUPolicy.groups.students.quota.gpus: expected a number, got 'ten'

The names the package imports, gathered from ``core.policy``: the dataclasses and
the one cap check (``policy.types``), every key declared once with its type,
default, check and help (``policy.keys``, ``policy.settings``) and the parser that
reads a policy through them (``policy.parse``). Pure: no I/O.
"""

from __future__ import annotations

from .policy.checks import ACCOUNTED_OVERRIDES
from .policy.keys import GPU_TOLERATION, KINDS, SCHEDULERS, WHEN_EXHAUSTED, WHEN_FULL
from .policy.parse import hub_namespace_errors, parse_policy
from .policy.schema import PREFIX, unknown_settings
from .policy.types import (
    JUPYTERLAB,
    PRIVATE_RANGES,
    SYSTEM_NAMESPACES,
    Amounts,
    Budget,
    Dataset,
    Egress,
    FairShare,
    Flavor,
    GpuRequest,
    Group,
    Idle,
    Interface,
    Option,
    Passed,
    Policy,
    PolicyError,
    Profile,
    Rate,
    Scheduler,
    Totals,
    dns_label,
    is_system_namespace,
)

__all__ = [
    "ACCOUNTED_OVERRIDES",
    "GPU_TOLERATION",
    "JUPYTERLAB",
    "KINDS",
    "PREFIX",
    "PRIVATE_RANGES",
    "SCHEDULERS",
    "SYSTEM_NAMESPACES",
    "WHEN_EXHAUSTED",
    "WHEN_FULL",
    "Amounts",
    "Budget",
    "Dataset",
    "Egress",
    "FairShare",
    "Flavor",
    "GpuRequest",
    "Group",
    "Idle",
    "Interface",
    "Option",
    "Passed",
    "Policy",
    "PolicyError",
    "Profile",
    "Rate",
    "Scheduler",
    "Totals",
    "dns_label",
    "hub_namespace_errors",
    "is_system_namespace",
    "parse_policy",
    "unknown_settings",
]
