"""What the spawner checks before anything is written, and how it refuses.

Every spawn checks the hub's set-up (a policy, and no profile list of the site's
own) and the spawn's options against the user's groups (``core.selection``), before
admission. A refusal is an HTTP error with a one-line reason the user reads (403 by
default; 400 for options of the wrong type): a handled rejection, so a storm of
refused spawns never trips JupyterHub's ``consecutive_failure_limit``. An
unreachable Kubernetes API server is one too (503), not a traceback; and so is a
hub whose set-up no spawn can work with (500), with the details in the hub log.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import aiohttp
import jupyterhub
from kubernetes_asyncio.client.rest import ApiException
from tornado import web

from ..config.values import site_profile_list_error
from ..core.model import Policy, PolicyError
from ..core.selection import Malformed, Refused, Selection, select
from ..core.shaping import mount_collisions
from ..kube.client import exception_message
from .ports import CheckedSpawn

#: JupyterHub before 6 counts refused spawns towards consecutive_failure_limit
JUPYTERHUB_COUNTS_REFUSALS = jupyterhub.version_info < (6,)

#: why a spawn was refused, in one word, where its status does not say it
#: (the hub counts refused spawns by it: ``spawn_metrics``)
REFUSED_OPTIONS = "options"
REFUSED_DATASET_CLAIM = "dataset_claim"
REFUSED_KUBERNETES = "kubernetes"


class SpawnRefused(web.HTTPError):
    """A spawn the policy does not allow; its text is what the user reads."""

    def __init__(self, message: str, status: int = 403, kind: str = "") -> None:
        super().__init__(status, "%s", message)
        self.message = message
        #: why, in one word, for the hub's count of refused spawns (``spawn_metrics``);
        #: empty: read from the status
        self.kind = kind
        # JupyterHub shows this on the spawn-pending page of a failed spawn
        # (format_exception(only_jupyterhub=True)); without it that page says
        # only "Spawn failed"
        self.jupyterhub_message = message

    def __str__(self) -> str:
        return self.message


def checked_policy(spawner: CheckedSpawn) -> Policy:
    """The spawner's policy; a broken or missing one refuses the spawn."""
    try:
        policy = spawner.gpu_policy
    except PolicyError as e:
        spawner.log.error("GPU policy is invalid:\n%s", e)
        raise SpawnRefused(
            "the GPU policy is misconfigured; an admin must fix it (see the hub log)", 500
        ) from e
    if "GPUPolicy" not in spawner.config:
        # the start-up check refuses such a hub; a config it did not see lands here
        spawner.log.error(
            "spawner_class is gpu-kubespawner but no GPU policy is configured "
            "(no hub.config.GPUPolicy, or c.GPUPolicy): nobody can start a server. "
            "Add the policy, or check the values with `jupyterhub-gpu check`."
        )
        raise SpawnRefused(
            "no GPU policy is configured on this hub, so no server can start; "
            "an admin must add one (see the hub log)",
            500,
        )
    return policy


def refuse_a_site_profile_list(spawner: CheckedSpawn, profile_list: Any) -> None:
    """A profile_list the site set itself (a list, mapping or callable) would show
    profiles the policy never admits: a clear error instead of a refused spawn."""
    problem = site_profile_list_error("c.KubeSpawner.profile_list", profile_list)
    if problem:
        spawner.log.error("%s", problem)
        raise SpawnRefused(
            "this hub's profile_list setting conflicts with its GPU policy, so no "
            "server can start; an admin must remove it (see the hub log)",
            500,
        )


def selected(spawner: CheckedSpawn, policy: Policy, groups: list[str]) -> Selection:
    """What the spawn's options select from what ``groups`` are offered; options that
    select nothing allowed are refused (400 when of the wrong type, else 403)."""
    try:
        return _select(policy, groups, spawner.user_options)
    except SpawnRefused as e:
        if not _options_are_the_saved_ones(spawner):
            raise
        # A start that sent no options reuses the server's last ones, which may name
        # a profile from before the policy (or a policy change): treated as absent,
        # as KubeSpawner's form drops unknown saved options.
        spawner.log.info(
            "%s: the server's saved options are not valid under the GPU policy (%s); "
            "starting it with the default profile",
            spawner._log_name,
            e,
        )
        return _select(policy, groups, {})


def _select(policy: Policy, groups: list[str], options: Any) -> Selection:
    try:
        return select(policy, groups, options)
    except Refused as e:
        # options of the wrong type are a bad request; the rest is forbidden
        raise SpawnRefused(
            str(e), 400 if isinstance(e, Malformed) else 403, kind=REFUSED_OPTIONS
        ) from None


def _options_are_the_saved_ones(spawner: CheckedSpawn) -> bool:
    """Whether this start's options are JupyterHub's saved ones: it reuses a server's
    last options when a start sends none (a REST start without a body)."""
    request = getattr(spawner.handler, "request", None)
    return request is not None and not request.body


def not_a_hub_failure(spawner: CheckedSpawn) -> None:
    """Keep a refusal out of the hub's count of consecutive failed spawns.

    JupyterHub exits when ``Spawner.consecutive_failure_limit`` spawns fail in a
    row (z2jh's default: 5). From JupyterHub 6 on, a refusal (an HTTP error below
    500) is a handled rejection and is not counted; JupyterHub 5, which z2jh 4.x
    ships, counts every failed spawn, so five refused spawns in a row (a full
    quota, a forged request) would stop the hub. There the count, which
    JupyterHub raises by one when this spawn fails, is lowered by one first.
    """
    if JUPYTERHUB_COUNTS_REFUSALS and spawner.handler is not None:
        settings = spawner.handler.settings
        settings["failure_count"] = settings.get("failure_count", 0) - 1


def refuse_mount_collisions(spawner: CheckedSpawn, policy: Policy, group: str) -> None:
    """A dataset mounted where the chart's home (or a profile's volume) already is:
    Kubernetes would refuse the pod; say which dataset and where, before anything
    is reserved."""
    problems = mount_collisions(policy.datasets_of(group), spawner.volumes, spawner.volume_mounts)
    if problems:
        spawner.log.error("GPU policy datasets collide with the server's volumes: %s", problems)
        raise SpawnRefused(f"{problems[0]}; an admin must fix it", 500)


async def refuse_missing_claims(
    spawner: CheckedSpawn, policy: Policy, group: str, namespace: str
) -> None:
    """Each claim the group's datasets name must exist in the server's namespace: a
    pod with a missing claim would wait in Pending until the start times out."""
    for dataset in policy.datasets_of(group):
        claim = dataset.claim
        if claim is None:
            continue
        try:
            with kubernetes_reachable():
                await spawner.api.read_namespaced_persistent_volume_claim(claim, namespace)
        except ApiException as e:
            if e.status != 404:
                raise SpawnRefused(
                    f"the dataset {dataset.display_name}'s PersistentVolumeClaim {claim} "
                    f"could not be read in namespace {namespace}: {exception_message(e)}",
                    503 if e.status >= 500 else 500,
                ) from None
            raise missing_claim(dataset.display_name, claim, namespace) from None


def missing_claim(dataset: str, claim: str, namespace: str) -> SpawnRefused:
    """A group's dataset whose claim does not exist where the server would run."""
    return SpawnRefused(
        f"the dataset {dataset} needs the PersistentVolumeClaim {claim} in namespace "
        f"{namespace}, and there is none: nothing was started; an admin must create the "
        "claim, or remove the dataset from the group",
        kind=REFUSED_DATASET_CLAIM,
    )


def kubernetes_refused(message: str) -> SpawnRefused:
    """The API server refused the server's pod (a namespace's ResourceQuota, a missing
    PriorityClass): its words, and what to do."""
    return SpawnRefused(
        f"Kubernetes refused the server: {message}; nothing was started: try again later, "
        "and tell an admin if it persists",
        kind=REFUSED_KUBERNETES,
    )


def unreachable(error: Exception) -> SpawnRefused:
    return SpawnRefused(
        f"the Kubernetes API server could not be reached ({type(error).__name__}); "
        "nothing was started: try again in a minute, and tell an admin if it persists",
        503,
    )


@contextlib.contextmanager
def kubernetes_reachable() -> Iterator[None]:
    """An unreachable API server becomes one line for the user (503), not a traceback."""
    try:
        yield
    except (aiohttp.ClientError, OSError) as e:
        raise unreachable(e) from None
