"""A large usage database made fast (rows written straight with ``executemany``): a
year of a cluster's GPU servers, for the tests and benchmarks of reading it."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.model import Policy, parse_policy

DAY = 86400.0
YEAR = 365 * DAY
DEPARTMENTS = 4
GROUPS_PER_DEPARTMENT = 5
USERS = 2000


def year_policy() -> Policy:
    """Departments with a year's budget, their groups with 30 days' and each member's
    own 30 days': every owner kind a pass sums (a group, its parent, a member)."""
    groups: dict = {}
    for d in range(DEPARTMENTS):
        groups[f"dept{d}"] = {"budget": {"gpu_hours": 10_000_000, "period": "365d"}}
        for g in range(GROUPS_PER_DEPARTMENT):
            groups[f"lab{d}-{g}"] = {
                "parent": f"dept{d}",
                "quota": {"gpus": 64},
                "profiles": ["gpu"],
                "budget": {"gpu_hours": 200_000, "period": "30d"},
                "per_user": {"budget": {"gpu_hours": 2_000, "period": "30d"}},
            }
    return parse_policy(
        flavors={"a100": {"kind": "gpu"}},
        profiles={"gpu": {"gpu": {"flavor": "a100"}}},
        groups=groups,
    )


def fill(path: Path, rows: int, now: float, *, seed: int = 1) -> str:
    """A usage database at ``path`` with ``rows`` servers over the year before ``now``
    (a few hundred still running), and its URL."""
    url = f"sqlite:///{path}"
    store = UsageStore(url)
    store.snapshot(now - 1, now)  # creates the tables
    store.dispose()
    rng = random.Random(seed)
    labs = [f"lab{d}-{g}" for d in range(DEPARTMENTS) for g in range(GROUPS_PER_DEPARTMENT)]
    values = []
    for i in range(rows):
        user = rng.randrange(USERS)
        started = now - YEAR + (i + rng.random()) * (YEAR / rows)
        length = rng.expovariate(1 / (8 * 3600))
        ended = started + length
        if ended > now - 60:
            ended = None
        seen = min(started + length, now - 30)
        values.append(
            (
                f"uid-{i}", f"ns/jupyter-u{user}-{i}", f"u{user}", labs[user % len(labs)], "gpu",
                "a100", float(rng.choice((1, 1, 2, 4, 8))), started, seen, ended,
                ended is not None, now, 1,
            )
        )  # fmt: skip
    connection = sqlite3.connect(path)
    with connection:
        connection.executemany(
            'INSERT INTO jupyterhub_gpu_usage (uid, key, user, "group", profile, flavor, '
            "gpus, started, last_seen, ended, end_inferred, updated, revision) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            values,
        )
        connection.execute("UPDATE jupyterhub_gpu_usage_revision SET value = 1")
    connection.close()
    return url
