"""The checks of single keys that say more than their type: a MIG profile's form, a
percentage's range, a list of networks. Each is named by its key in ``keys``
(``Checked(check=...)`` reads a value with it; ``Key(check=...)`` checks a value its
type has read) and reports in the words an admin reads. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

from .schema import Errors

#: Keys a profile's kubespawner_override may not set: they would bypass accounting.
ACCOUNTED_OVERRIDES = frozenset(
    {
        "cpu_guarantee",
        "cpu_limit",
        "mem_guarantee",
        "mem_limit",
        "extra_resource_guarantees",
        "extra_resource_limits",
        "node_selector",
        "tolerations",
        "scheduler_name",
        "priority_class_name",
        "extra_pod_config",
        "extra_labels",
        "namespace",
        "profile_list",
    }
)
_MIG_PROFILE = re.compile(r"^([1-7])g\.\d+gb(\+me)?$")
_DNS_SUBDOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
#: a server-relative URL path, as JupyterHub's default_url takes it
_URL_PATH = re.compile(r"^/(?!/)[^\s?#]*(\?[^\s#]*)?$")
# a DN's attribute=value parts are separated by commas that are not escaped (RFC 4514)
_DN_SEPARATOR = re.compile(r"(?<!\\),")
_DN_ATTRIBUTE = re.compile(r"^\s*[A-Za-z][A-Za-z0-9-]*\s*=|^\s*\d+(\.\d+)+\s*=")


# ---- read with a key's type: Checked(check=f), f(e, path, value) ------------------


def tolerations(e: Errors, path: str, value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not all(isinstance(t, Mapping) for t in value):
        e.add(path, f"expected a list of tolerations, got {value!r}")
        return ()
    return tuple(dict(t) for t in value)


def cel_expressions(e: Errors, path: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        e.add(path, f"expected a list of CEL expressions, got {value!r}")
        return ()
    return tuple(value)


def overrides(e: Errors, path: str, value: Any) -> dict[str, Any]:
    """A profile's kubespawner_override: anything the policy does not account."""
    override = e.mapping(path, value)
    for key in override:
        if key in ACCOUNTED_OVERRIDES:
            e.add(
                f"{path}.{key}",
                "is set by the policy (cpu, memory, gpu, flavors and the scheduler); "
                "use the profile's own keys instead",
            )
    return dict(override)


def directory_groups(e: Errors, path: str, raw: Any) -> tuple[str, ...]:
    """Directory group names, DNs, IDs or paths; a number (a gidNumber) is read as text."""
    if not isinstance(raw, list):
        e.add(path, f"expected a list of directory group names, DNs, IDs or paths, got {raw!r}")
        return ()
    found: list[str] = []
    for i, item in enumerate(raw):
        if isinstance(item, int) and not isinstance(item, bool):
            item = str(item)
        if not isinstance(item, str) or not item.strip():
            e.add(f"{path}[{i}]", f"expected a group name, DN, ID or path, got {item!r}")
            continue
        if "=" in item and not all(_DN_ATTRIBUTE.match(p) for p in _DN_SEPARATOR.split(item)):
            e.add(
                f"{path}[{i}]",
                f"{item!r} is not a DN: every comma-separated part is attribute=value, "
                "as in cn=research,ou=groups,dc=example,dc=edu",
            )
            continue
        if item in found:
            e.add(f"{path}[{i}]", f"{item!r} is listed twice")
            continue
        found.append(item)
    return tuple(found)


def share(e: Errors, path: str, raw: Any) -> float:
    """A fair-share weight: a number above 0 (a share of 0 would never go first)."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        e.add(path, f"expected a number above 0 such as 1 or 2.5, got {raw!r}")
        return 1.0
    try:
        weight = float(raw)
    except ValueError:
        weight = float("nan")
    if not math.isfinite(weight) or weight <= 0:
        e.add(path, f"expected a number above 0 such as 1 or 2.5, got {raw!r}")
        return 1.0
    return weight


def utilization(e: Errors, path: str, value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 100:
        e.add(path, f"expected a percentage above 0 and at most 100, got {value!r}")
        return None
    return float(value)


def cidrs(e: Errors, path: str, raw: Any) -> tuple[str, ...]:
    """Networks in CIDR notation (a bare address is that one address), normalised."""
    if isinstance(raw, str) or not isinstance(raw, list | tuple):
        e.add(path, f"expected a list of networks like [198.51.100.0/24], got {raw!r}")
        return ()
    networks: list[str] = []
    for i, item in enumerate(raw):
        if not isinstance(item, str):
            e.add(f"{path}[{i}]", f"expected a network like 198.51.100.0/24, got {item!r}")
            continue
        try:
            network = ipaddress.ip_network(item.strip(), strict=True)
        except ValueError as err:
            if "host bits set" in str(err):
                fixed = ipaddress.ip_network(item.strip(), strict=False)
                e.add(f"{path}[{i}]", f"{item!r} has host bits set: write {str(fixed)!r}")
            else:
                e.add(f"{path}[{i}]", f"expected a network like 198.51.100.0/24, got {item!r}")
            continue
        if str(network) in networks:
            e.add(f"{path}[{i}]", f"{item!r} is listed twice")
        else:
            networks.append(str(network))
    return tuple(networks)


def moment(e: Errors, path: str, raw: Any) -> float | None:
    """A moment, as epoch seconds: an ISO 8601 date and time with its offset
    (``2026-12-01T00:00:00+01:00``), or a date alone (midnight UTC)."""
    value = raw
    if isinstance(value, str):
        text = value.strip()
        try:
            # a date alone is a date (fromisoformat would make it a time without offset)
            value = date.fromisoformat(text) if len(text) == 10 else datetime.fromisoformat(text)
        except ValueError:
            value = None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            e.add(path, f"give the time's offset, e.g. {value.isoformat()}+01:00 or Z, got {raw!r}")
            return None
        return value.timestamp()
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC).timestamp()
    e.add(
        path,
        f"expected a date like 2026-12-01 or a time like 2026-12-01T00:00:00+01:00, got {raw!r}",
    )
    return None


# ---- after a key's type: Key(check=f), f(e, path, value, written) -----------------


def mig_profile(e: Errors, path: str, value: Any, written: Any) -> str | None:
    if value and not _MIG_PROFILE.match(value):
        e.add(path, f"expected a MIG profile such as 1g.5gb or 3g.40gb, got {value!r}")
        return None
    return value


def between_0_and_1(e: Errors, path: str, value: Any, written: Any) -> Any:
    if value is not None and not 0 < value < 1:
        e.add(path, f"expected a number between 0 and 1, got {written!r}")
        return None
    return value


def positive(e: Errors, path: str, value: Any, written: Any) -> Any:
    if value is not None and value <= 0:
        e.add(path, f"expected a positive number, got {written!r}")
        return None
    return value


def above_zero(e: Errors, path: str, value: Any, written: Any) -> Any:
    if value is not None and value <= 0:
        e.add(path, "expected a number > 0")
    return value


def percentage(e: Errors, path: str, value: Any, written: Any) -> Any:
    if value is not None and value > 100:
        e.add(path, f"expected a percentage 1-100, got {value}")
    return value


def regular_expression(e: Errors, path: str, value: Any, written: Any) -> str | None:
    if value is not None:
        try:
            re.compile(value)
        except re.error as err:
            e.add(path, f"not a regular expression: {err}")
            return None
    return value


def url_path(e: Errors, path: str, value: Any, written: Any) -> str | None:
    if value is not None and (not _URL_PATH.match(value) or ".." in value.split("/")):
        e.add(path, f"expected a path on the user's server such as /lab or /vscode/, got {value!r}")
        return None
    return value


def claim_name(e: Errors, path: str, value: Any, written: Any) -> str | None:
    if value is not None and not _DNS_SUBDOMAIN.match(value):
        e.add(path, f"not a PersistentVolumeClaim name: {value!r}")
        return None
    return value


def absolute_export(e: Errors, path: str, value: Any, written: Any) -> str | None:
    if value is not None and not value.startswith("/"):
        e.add(path, f"expected the export's absolute path, got {value!r}")
        return None
    return value


def label_templates(e: Errors, path: str, value: Any, written: Any) -> dict[str, str]:
    """Pod label values with placeholders the spawner fills in."""
    for key, template in value.items():
        try:
            template.format(username="u", group="g", profile="p", flavor="f", servername="s")
        except (KeyError, IndexError, ValueError) as err:
            e.add(
                f"{path}.{key}",
                f"unknown placeholder {err} (use {{username}}, {{group}}, {{profile}}, "
                "{{flavor}} or {{servername}})",
            )
    return value
