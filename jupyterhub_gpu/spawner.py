"""``GPUKubeSpawner``: KubeSpawner with the GPU policy in its spawn path.

Every chart setting of ``c.KubeSpawner`` still applies (traitlets merges config
along the class hierarchy); the policy adds, in KubeSpawner's own order:

1. ``profile_list`` (unless the admin set one): one entry per (group, profile)
   the user's groups allow, with the group's live remaining quota.
2. ``load_user_options``: ``user_options`` from the form or the REST API are
   validated against the user's groups (``selection.select``), then admitted
   against the ledger (``admission.Ledger``), then the pod shape is applied on
   top of the profile's overrides, so nothing a profile or hook sets can undo
   the accounting.
3. ``get_pod_manifest``: the final labels, annotations, runtime class and DRA
   claims.

A refusal is an HTTP 403 with a one-line reason: a handled rejection, so a storm
of refused spawns never trips ``consecutive_failure_limit``. Any failure after
admission releases the reservation; ``stop`` releases the charge.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import aiohttp
import jupyterhub
from kubernetes_asyncio.client import (
    ApiException,
    CustomObjectsApi,
    V1DeleteOptions,
    V1Preconditions,
)
from kubespawner import KubeSpawner
from tornado import web
from traitlets import Any as AnyValue
from traitlets import Bool, Float, default, validate

from .accounting.store import UsageStore
from .config.policy import GPUPolicy
from .config.values import site_profile_list_error
from .core.admission import Charge, Decision, Ledger
from .core.adoption import adopt, servers_selector, username_of
from .core.budgets import BudgetState
from .core.capacity import FlavorCapacity
from .core.manifests import IN_QUOTA_PRIORITY, OVER_QUOTA_PRIORITY
from .core.model import Policy, PolicyError
from .core.pending import (
    explain_unschedulable,
    gated_by_kueue,
    kueue_position,
    kueue_queue_line,
    podgroup_of,
    volcano_position,
    volcano_queue_line,
    volcano_queued,
    workload_of,
)
from .core.profiles import profile_entry, without_overrides
from .core.quantities import format_gpus
from .core.selection import Malformed, Refused, Selection, offers, select
from .core.shaping import (
    GROUP_LABEL,
    QUEUE_LABELS,
    VOLCANO_QUEUE_ANNOTATION,
    PodShape,
    apply_to_pod,
    charge_from_pod,
    merge_settings,
    namespace_for,
    of_another_hub,
    shape,
)
from .kube.client import exception_message
from .kube.clusterview import ClusterView
from .spawn_admission import SpawnAdmission

#: JupyterHub before 6 counts refused spawns towards consecutive_failure_limit
JUPYTERHUB_COUNTS_REFUSALS = jupyterhub.version_info < (6,)
#: the schedulers that hold a server's pod in a queue before it is scheduled, as the
#: spawn page names them
QUEUED_BY = {"kueue": "Kueue", "volcano": "Volcano"}
#: what each keeps per queued pod (group, version, plural): Kueue's Workloads (in the
#: version the pinned Kueue stores; it serves v1beta1 too), Volcano's PodGroups
QUEUE_OBJECTS = {
    "kueue": ("kueue.x-k8s.io", "v1beta2", "workloads"),
    "volcano": ("scheduling.volcano.sh", "v1beta1", "podgroups"),
}
#: Volcano's Queues, whose state says whether one admits anything at all
VOLCANO_QUEUES = ("scheduling.volcano.sh", "v1beta1", "queues")
#: "wait indefinitely" as a number of seconds (JupyterHub's start_timeout is an Integer)
NO_QUEUE_TIMEOUT = 10 * 365 * 24 * 3600


class SpawnRefused(web.HTTPError):
    """A spawn the policy does not allow; its text is what the user reads."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(status, "%s", message)
        self.message = message
        # JupyterHub shows this on the spawn-pending page of a failed spawn
        # (format_exception(only_jupyterhub=True)); without it that page says
        # only "Spawn failed"
        self.jupyterhub_message = message

    def __str__(self) -> str:
        return self.message


class GPUKubeSpawner(KubeSpawner):
    """KubeSpawner that offers, checks, charges and shapes servers by the GPU policy."""

    wait_poll_interval = Float(
        2.0,
        help="""
        Seconds between re-checks of a waiting spawn even when no server was
        released here (another hub replica, or a pod removed by an admin).
        """,
    ).tag(config=True)

    show_cluster_capacity = Bool(
        True,
        help="""
        Show each GPU profile's free cluster capacity (node allocatable minus what
        bound pods request) in the profile list, from a watch of nodes and pods in
        all namespaces. Needs RBAC the chart does not grant (``jupyterhub-gpu
        manifests`` renders it); without it the list says capacity is unknown and
        the hub log warns once.
        """,
    ).tag(config=True)

    queue_timeout = Float(
        24 * 3600.0,
        help="""
        Seconds a server may wait in its scheduler's queue (scheduler ``kueue`` or
        ``volcano``) before its spawn is given up and its pod deleted; 0: wait as
        long as it takes.

        While the scheduler holds the server's pod in its queue (Kueue: behind its
        admission gate; Volcano: its PodGroup ``Pending``), the spawn page shows the
        server's position in the queue and the scheduler's reason, and
        ``start_timeout`` does not run: it bounds the start before the pod is
        queued, and starts again from zero when the scheduler admits the pod, so a
        server admitted after an hour in the queue still gets all of
        ``start_timeout`` to start.
        """,
    ).tag(config=True)

    ledger_resync_interval = Float(
        60.0,
        help="""
        Seconds between checks of the GPU ledger against the pods in Kubernetes
        (0: never). Servers whose pod vanished without the hub noticing are
        released; charged pods the ledger lacks are counted. The ledger is also
        rebuilt from pods whenever the hub starts.
        """,
    ).tag(config=True)

    user_options = AnyValue(
        help="""
        The options of the spawn being started, as the form or a REST request sent
        them. Any JSON value is taken here, so that a request body that is not an
        object reaches ``load_user_options`` and is refused there with a clear
        message, instead of failing inside JupyterHub, where JupyterHub 5 would
        count it towards ``consecutive_failure_limit``.
        """,
    )

    @default("user_options")
    def _no_options(self) -> dict:
        return {}

    #: the admission every spawner of this hub shares (see ``admission``)
    _hub_admission: SpawnAdmission | None = None
    #: this spawner's own admission instead: offline rendering and tests give one
    _own_admission: SpawnAdmission | None = None
    #: the watch of nodes and bound pods the profile list's capacity is read from
    _cluster_view: ClusterView | None = None
    _policies: dict[int, tuple[Any, Policy]] = {}
    #: what the spawn page shows while this spawn waits in its group's line
    _gpu_wait_message: str | None = None
    #: true from start() until the pod exists or the start failed
    _gpu_starting: bool = False
    #: the charge this server's current start made (released if the start fails)
    _gpu_reservation: Charge | None = None
    #: the last start was refused before anything was written to Kubernetes
    _gpu_refused_before_kubernetes: bool = False
    #: what the spawn page shows while a scheduler holds this server's pod in its queue
    _queue_wait_message: str | None = None
    #: start_timeout as configured (start() lengthens it for JupyterHub while queued)
    _start_timeout_configured: int | None = None
    #: Workloads or PodGroups listed per namespace, Volcano Queues read: (when, the
    #: answer), shared by spawners
    _queue_listings: dict[tuple, tuple[float, asyncio.Future]] = {}
    #: the queue objects the hub was refused reading (each logged once)
    _queue_read_refused: set[tuple[str, str, str]] = set()
    #: KubeSpawner is applying validated options (it reads the profile list for them)
    _gpu_applying_options: bool = False
    #: servers from before the policy whose charge the hub log has told (once each)
    _adoptions_logged: set[str] = set()
    #: what the last validated spawn chose, and the pod shape the policy gives it
    gpu_selection: Selection | None = None
    gpu_shape: PodShape | None = None

    # ---- policy and shared state -------------------------------------------------

    @property
    def gpu_policy(self) -> Policy:
        """The checked policy; a broken one refuses every spawn with the errors."""
        cached = self._policies.get(id(self.config))
        if cached and cached[0] is self.config:
            return cached[1]
        policy = GPUPolicy(config=self.config).model
        GPUKubeSpawner._policies[id(self.config)] = (self.config, policy)
        return policy

    def _policy_or_refuse(self) -> Policy:
        try:
            policy = self.gpu_policy
        except PolicyError as e:
            self.log.error("GPU policy is invalid:\n%s", e)
            raise SpawnRefused(
                "the GPU policy is misconfigured; an admin must fix it (see the hub log)", 500
            ) from e
        if "GPUPolicy" not in self.config:
            # the start-up check refuses such a hub; a config it did not see lands here
            self.log.error(
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

    def _refuse_a_site_profile_list(self) -> None:
        """A profile_list the site set itself (a list, mapping or callable) would show
        profiles the policy never admits: a clear error instead of a refused spawn."""
        if getattr(self.profile_list, "__func__", None) is GPUKubeSpawner._gpu_profile_list:
            return
        problem = site_profile_list_error("c.KubeSpawner.profile_list", self.profile_list)
        if problem:
            self.log.error("%s", problem)
            raise SpawnRefused(
                "this hub's profile_list setting conflicts with its GPU policy, so no "
                "server can start; an admin must remove it (see the hub log)",
                500,
            )

    @property
    def admission(self) -> SpawnAdmission:
        """The ledger and waiting lines this spawner admits against."""
        if self._own_admission is not None:
            return self._own_admission
        if GPUKubeSpawner._hub_admission is None:
            admission = SpawnAdmission(self.log)
            settings = GPUPolicy(config=self.config)
            admission.use_store(
                UsageStore(settings.accounting_url), fail_open=settings.accounting_fail_open
            )
            GPUKubeSpawner._hub_admission = admission
        return GPUKubeSpawner._hub_admission

    def _namespaces(self, policy: Policy) -> list[str]:
        if policy.namespace_per_group:
            return [namespace_for(policy, g.name) for g in policy.all_groups]
        return [self.namespace]

    async def _charges_from_pods(self, policy: Policy) -> list[Charge]:
        charges = await self._adopted_charges(policy)
        for namespace in self._namespaces(policy):
            try:
                pods = await self.api.list_namespaced_pod(
                    namespace,
                    label_selector=GROUP_LABEL,
                    _request_timeout=self.k8s_api_request_timeout,
                )
            except ApiException as e:
                if e.status == 404:
                    continue
                raise
            for pod in pods.items:
                listed = self.api.api_client.sanitize_for_serialization(pod)
                if of_another_hub(listed, self._hub_namespace):
                    continue  # e.g. a staging hub's, in group namespaces of the same names
                try:
                    charge = charge_from_pod(listed)
                except ValueError as e:
                    self.log.warning("%s; it is not counted", e)
                    continue
                if charge is not None:
                    charges.append(charge)
        return charges

    async def _adopted_charges(self, policy: Policy) -> list[Charge]:
        """The charges of servers started before the policy (see ``core.adoption``):
        KubeSpawner's server pods in the hub's namespace without the policy's labels."""
        try:
            pods = await self.api.list_namespaced_pod(
                self._hub_namespace,
                label_selector=servers_selector(self.component_label, unlabelled=True),
                _request_timeout=self.k8s_api_request_timeout,
            )
        except ApiException as e:
            if e.status == 404:
                return []
            raise
        listed = [self.api.api_client.sanitize_for_serialization(p) for p in pods.items]
        groups = self._hub_groups({username_of(p) for p in listed} - {""})
        charges = []
        for pod in listed:
            adopted = adopt(policy, pod, groups.get(username_of(pod), ()), self.component_label)
            if adopted is None:
                continue
            if adopted.key not in GPUKubeSpawner._adoptions_logged:
                GPUKubeSpawner._adoptions_logged.add(adopted.key)
                held = f"{format_gpus(adopted.request.gpus)} GPUs" + (
                    f" of flavor {adopted.flavor}" if adopted.flavor else ""
                )
                if adopted.group is not None:
                    self.log.info(
                        "Server pod %s of %s, started before the GPU policy (%s), is charged "
                        "to %s: %s",
                        adopted.key,
                        adopted.user,
                        held,
                        adopted.group,
                        adopted.why,
                    )
                else:
                    self.log.warning(
                        "Server pod %s of %s, started before the GPU policy (%s), is charged "
                        "to no group: %s. Set GPUPolicy.adopted_servers_group to charge such "
                        "servers, or ask the user to restart it through a policy profile.",
                        adopted.key,
                        adopted.user,
                        held,
                        adopted.why,
                    )
            if adopted.charge is not None:
                charges.append(adopted.charge)
        return charges

    def _hub_groups(self, users: Iterable[str]) -> dict[str, list[str]]:
        """Each user's JupyterHub groups, from the hub's database (none offline)."""
        db = getattr(self.user, "db", None)
        if db is None:
            return {}
        from jupyterhub import orm

        found = {}
        for name in users:
            user = orm.User.find(db, name)
            found[name] = [g.name for g in user.groups] if user is not None else []
        return found

    def __init__(self, *args: Any, admission: SpawnAdmission | None = None, **kwargs: Any) -> None:
        """``admission``: this spawner's own instead of the hub's shared one (offline
        rendering admits against an empty cluster of its own)."""
        self._own_admission = admission
        super().__init__(*args, **kwargs)
        # the namespace the chart configured: where servers from before the policy run
        # (a spawn may move this spawner's own namespace to its group's)
        self._hub_namespace = self.namespace
        # Rebuild the ledger as soon as the hub makes its first GPU spawner (at hub start
        # for running servers, or at a user's first request), not when the first spawn
        # reaches start(): in a storm of spawns JupyterHub's own per-spawn work comes
        # first, and every spawn would wait behind it for the ledger.
        if not self.admission.loaded:
            try:
                policy = self.gpu_policy
            except PolicyError:
                return  # every spawn reports the broken policy itself (_policy_or_refuse)
            self.admission.begin_rebuild(policy, self._listed_charges, self.ledger_resync_interval)

    async def _ledger(self, policy: Policy) -> Ledger:
        """The shared ledger, rebuilt from pod labels the first time it is needed."""
        return await self.admission.ready_ledger(
            policy, self._listed_charges, self.ledger_resync_interval
        )

    async def _listed_charges(self, policy: Policy) -> list[Charge]:
        with _kubernetes_reachable():
            return await self._charges_from_pods(policy)

    # ---- the profile list ----------------------------------------------------------

    @default("profile_list")
    def _default_profile_list(self):
        return self._gpu_profile_list

    @validate("profile_list")
    def _empty_profile_list_means_the_policy(self, proposal):
        # z2jh writes its default singleuser.profileList ([]) to c.KubeSpawner.profile_list,
        # which would hide every profile; an admin's own non-empty list or callable is kept,
        # and every spawn then says it conflicts with the policy (_refuse_a_site_profile_list)
        value = proposal["value"]
        return self._gpu_profile_list if isinstance(value, list | dict) and not value else value

    def _user_groups(self) -> list[str]:
        return [g.name for g in getattr(self.user, "groups", [])]

    async def _gpu_profile_list(self, spawner: KubeSpawner) -> list[dict[str, Any]]:
        policy = self._policy_or_refuse()
        ledger = await self._ledger(policy)
        # a spawn resolves its profile from this list too, and needs no capacity for
        # it: only the form a person reads waits for the first list of nodes and pods
        capacity = await self._capacity(policy, wait=not self._gpu_applying_options)
        budgets = self.admission.budgets
        per_group: dict[str, list[BudgetState]] = {}
        entries = []
        for offer in offers(policy, self._user_groups()):
            group = offer.group
            if group.name not in per_group:
                per_group[group.name] = budgets(policy, self.user.name, group)
            entries.append(profile_entry(policy, ledger, offer, capacity, per_group[group.name]))
        return entries

    def _render_options_form(self, profile_list):
        self._refuse_a_site_profile_list()
        # Every form template gets the list as a user may read it. KubeSpawner's own
        # shows no overrides, but jupyterhub-fancy-profiles hands the whole list to
        # the browser as JSON; load_user_options still applies the full entries.
        if not isinstance(self.user_options, Mapping):
            self.user_options = {}  # saved options that were never valid: no preselection
        return super()._render_options_form(without_overrides(profile_list))

    async def _capacity(
        self, policy: Policy, wait: bool = True
    ) -> dict[str, FlavorCapacity] | None:
        """Free cluster capacity per flavor, or None when it is unknown or turned off."""
        if not self.show_cluster_capacity:
            return None
        if GPUKubeSpawner._cluster_view is None:
            view = GPUKubeSpawner._cluster_view = ClusterView(self.api.api_client, self.log).start()
            if wait:
                # the first list of nodes and pods, so the very first page shows capacity
                await view.wait_ready(self.k8s_api_request_timeout)
        return GPUKubeSpawner._cluster_view.capacity(policy)

    # ---- the spawn path ------------------------------------------------------------

    @default("apply_user_options")
    def _options_are_applied_in_start(self):
        # JupyterHub >= 5.3 logs "Received unhandled user_options" for every spawn whose
        # options no apply_user_options hook took; ours are validated and applied in
        # load_user_options, inside start() after every hook, so that nothing can undo
        # the accounting. An admin's own c.Spawner.apply_user_options still wins.
        return _applied_in_load_user_options

    @property
    def _server_key(self) -> str:
        return f"{self.namespace}/{self.pod_name}"

    async def load_user_options(self) -> None:
        self._gpu_refused_before_kubernetes = False
        try:
            await self._load_user_options()
        except SpawnRefused:
            # nothing was written to Kubernetes for this spawn (admission refused it,
            # or its options): the stop JupyterHub sends next has nothing to delete
            self._gpu_refused_before_kubernetes = True
            raise

    async def _load_user_options(self) -> None:
        policy = self._policy_or_refuse()
        self._refuse_a_site_profile_list()
        try:
            selection = self._select(policy, self.user_options)
        except SpawnRefused as e:
            if not self._options_are_the_saved_ones():
                raise
            # A start that sent no options reuses the server's last ones, which may name
            # a profile from before the policy (or a policy change): treated as absent,
            # as KubeSpawner's form drops unknown saved options.
            self.log.info(
                "%s: the server's saved options are not valid under the GPU policy (%s); "
                "starting it with the default profile",
                self._log_name,
                e,
            )
            selection = self._select(policy, {})
        # KubeSpawner applies the profile list (the same offers) to the options as the
        # form would send them, never to the raw input: a JSON number for a choice
        # ("gpus": 1) is the choice "1" to us, and a KeyError in KubeSpawner
        self.user_options = selection.user_options
        self._gpu_applying_options = True
        try:
            await super().load_user_options()
        except (ValueError, KeyError, TypeError) as e:
            # the options were validated above, so this is a bug, not the user's doing;
            # still a refusal the user can read, never a hub error
            self.log.exception("KubeSpawner could not apply the validated server options")
            raise SpawnRefused(
                f"the server options could not be applied ({type(e).__name__}); "
                "tell an admin (see the hub log)",
                400,
            ) from None
        finally:
            self._gpu_applying_options = False
        namespace = namespace_for(policy, selection.group.name)
        if namespace:
            self.namespace = namespace
        decision = await self._admit(policy, selection)
        self.gpu_selection = selection
        self.gpu_shape = shape(
            policy,
            selection,
            decision.tier,
            username=self.user.name,
            servername=self.name or "",
            hub=self._hub_namespace,
        )
        current = {key: getattr(self, key) for key in _MERGED_TRAITS}
        for key, value in merge_settings(current, self.gpu_shape).items():
            setattr(self, key, value)

    def _select(self, policy: Policy, options: Any) -> Selection:
        try:
            return select(policy, self._user_groups(), options)
        except Refused as e:
            # options of the wrong type are a bad request; the rest is forbidden
            raise SpawnRefused(str(e), 400 if isinstance(e, Malformed) else 403) from None

    def _options_are_the_saved_ones(self) -> bool:
        """Whether this start's options are JupyterHub's saved ones: it reuses a server's
        last options when a start sends none (a REST start without a body)."""
        request = getattr(self.handler, "request", None)
        return request is not None and not request.body

    async def _admit(self, policy: Policy, selection: Selection) -> Decision:
        await self._ledger(policy)
        key = self._server_key

        def show_wait(message: str | None) -> None:
            self._gpu_wait_message = message

        decision = await self.admission.admit(
            policy,
            key,
            self.user.name,
            selection.group,
            selection.request,
            show_wait=show_wait,
            poll_interval=self.wait_poll_interval,
        )
        if not decision.admitted:
            raise SpawnRefused(decision.reason)
        self._gpu_reservation = self.admission.charge(key)
        self.log.info(
            "GPU admission: %s charged to %s (%s)", key, selection.group.name, decision.tier
        )
        return decision

    async def _release(self, only: Charge | None = None) -> None:
        """Free this server's charge (its pod is gone); with ``only``, just that charge."""
        await self.admission.release(self.gpu_policy, self._server_key, only)

    async def _release_reservation(self) -> None:
        """Free what this start reserved, and nothing else: the key may still carry the
        charge of an earlier pod whose stop failed, which must stay until it is gone."""
        reservation, self._gpu_reservation = self._gpu_reservation, None
        if reservation is not None:
            await self._release(only=reservation)

    def start(self):
        if self._queueing_scheduler():
            # JupyterHub gives start() start_timeout seconds, read once as this returns;
            # a server queued by its scheduler must outlast that. The hub's bound becomes
            # a backstop past every deadline _watch_queue enforces itself: the
            # start before the pod is queued, the time in the queue, the start after
            # admission.
            if self._start_timeout_configured is None:
                self._start_timeout_configured = self.start_timeout
            configured = self._start_timeout_configured
            queued = int(self.queue_timeout) if self.queue_timeout > 0 else NO_QUEUE_TIMEOUT
            self.start_timeout = 2 * configured + queued + 10
        return super().start()

    async def _start(self):
        try:
            return await self._within_queue_timeouts(self._start_charged())
        except SpawnRefused as e:
            if e.status_code < 500:
                _not_a_hub_failure(self)
            raise

    async def _start_charged(self):
        self._gpu_starting = True
        self._gpu_reservation = None
        try:
            # a pod watch that gave up during an outage would never see this pod
            with _kubernetes_reachable():
                await self._pods_listed()
            result = await super()._start()
        except ApiException as e:
            await self._release_reservation()
            if e.status == 403:
                # e.g. a namespace ResourceQuota or a missing PriorityClass: say which
                raise SpawnRefused(
                    f"Kubernetes refused the server: {exception_message(e)}"
                ) from None
            raise
        except (aiohttp.ClientError, OSError) as e:
            await self._release_reservation()
            raise _unreachable(e) from None
        except BaseException:
            # refused, pod creation failed, timed out or cancelled: nothing may stay charged
            await self._release_reservation()
            raise
        finally:
            self._gpu_starting = False
            self.admission.start_ended(self._server_key)
        self._gpu_reservation = None  # the server's charge now, released by its stop
        pod = self.pod_reflector.pods.get(self._server_key)
        if pod is not None:
            self.admission.record_start(self.gpu_policy, pod)
        return result

    # ---- waiting in a scheduler's queue (Kueue, Volcano) -------------------------------

    def _queueing_scheduler(self) -> str | None:
        """``kueue`` or ``volcano`` when the policy's scheduler queues servers' pods."""
        try:
            name = self.gpu_policy.scheduler.name
        except PolicyError:
            return None  # every spawn is refused with the policy's errors
        return name if name in QUEUED_BY else None

    async def _within_queue_timeouts(self, starting: Awaitable[Any]) -> Any:
        """``starting`` (the start), bounded by start_timeout except while queued.

        KubeSpawner waits for the pod to run under the lengthened start_timeout (see
        ``start``); the watch beside it gives up on the start when one of its own
        deadlines passes, and the start is cancelled (JupyterHub then stops the
        server, which deletes its pod and frees its charge).
        """
        scheduler = self._queueing_scheduler()
        if self._start_timeout_configured is None or scheduler is None:
            return await starting
        started = asyncio.get_running_loop().time()
        start = asyncio.ensure_future(starting)
        watch = asyncio.ensure_future(self._watch_queue(scheduler, started))
        try:
            await asyncio.wait({start, watch}, return_when=asyncio.FIRST_COMPLETED)
            if start.done():
                return start.result()
            start.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await start
            return watch.result()  # it only ends by raising: a deadline passed
        finally:
            for task in (start, watch):
                task.cancel()
            self._queue_wait_message = None
            self.start_timeout = self._start_timeout_configured

    async def _watch_queue(self, scheduler: str, started: float) -> None:
        """Raise when the start runs out of time, not counting the time queued.

        Until the pod is queued, and again from the scheduler's admission, the start
        has ``start_timeout``; while the scheduler holds the pod in its queue (Kueue:
        behind its admission gate; Volcano: its PodGroup ``Pending``),
        ``queue_timeout``. Meanwhile the spawn page's line says where the server is
        in the queue.
        """
        loop = asyncio.get_running_loop()
        label = QUEUED_BY[scheduler]
        start_timeout = self._start_timeout_configured or 0
        queued_since: float | None = None
        admitted_at: float | None = None
        while True:
            now = loop.time()
            pod = self._starting_pod()
            line = await self._queue_line(scheduler, pod) if pod is not None else None
            if pod is not None and line is not None:
                queued_since = queued_since if queued_since is not None else now
                self._queue_wait_message = line
                if self.queue_timeout > 0 and now - queued_since >= self.queue_timeout:
                    # 429, a handled rejection (a busy cluster, not a broken hub): it
                    # never counts towards the hub's consecutive_failure_limit
                    raise SpawnRefused(
                        f"the server waited {_duration(now - queued_since)} in {label} queue "
                        f"{_queue_of(scheduler, pod)} without being admitted (the hub's "
                        f"queue_timeout is {_duration(self.queue_timeout)}); it was not "
                        "started: try again later, or ask an admin about the queue",
                        429,
                    )
            else:
                if queued_since is not None and admitted_at is None:
                    admitted_at = now
                    self._queue_wait_message = None
                    self.log.info(
                        "%s admitted %s after %s in its queue",
                        label,
                        self._log_name,
                        _duration(now - queued_since),
                    )
                since = admitted_at if admitted_at is not None else started
                if now - since >= start_timeout:
                    after = f" after {label} admitted it" if admitted_at is not None else ""
                    raise TimeoutError(
                        f"pod {self._server_key} did not start in {start_timeout} seconds{after}"
                    )
            await asyncio.sleep(self.wait_poll_interval)

    def _starting_pod(self) -> dict | None:
        """This server's pod as the pod watch last saw it (none while being deleted)."""
        reflector = self.pod_reflector
        pod = reflector.pods.get(self._server_key) if reflector is not None else None
        if pod is None or pod.get("metadata", {}).get("deletionTimestamp"):
            return None
        return pod

    async def _queue_line(self, scheduler: str, pod: dict) -> str | None:
        """Where ``pod`` waits in its scheduler's queue, and why, in one line; None when
        the scheduler does not hold it (not yet queued, or admitted)."""
        if scheduler == "kueue" and not gated_by_kueue(pod):
            return None
        if scheduler == "volcano" and pod.get("spec", {}).get("nodeName"):
            return None
        queue = _queue_of(scheduler, pod)
        resource = QUEUE_OBJECTS[scheduler]
        try:
            listed = await self._queue_objects(resource, pod["metadata"]["namespace"])
        except ApiException as e:
            if e.status != 403:
                # the line keeps what it said; waiting goes on, watched by the pod watch
                self.log.warning(
                    "Reading %s for %s: %s", resource[2], self._log_name, exception_message(e)
                )
                return self._queue_wait_message or _unread_line(scheduler, queue)
            if resource not in GPUKubeSpawner._queue_read_refused:
                GPUKubeSpawner._queue_read_refused.add(resource)
                self.log.warning(
                    "Cannot read %s.%s (%s): the spawn page cannot show a server's place in "
                    "its %s queue. Grant the hub get/list/watch on them (`jupyterhub-gpu "
                    "manifests` renders it).",
                    resource[2],
                    resource[0],
                    exception_message(e),
                    QUEUED_BY[scheduler],
                )
            return _unread_line(scheduler, queue)
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            # the pod watch rides out an outage; the line waits for the API server too
            self.log.warning("Reading %s for %s: %s", resource[2], self._log_name, e)
            return self._queue_wait_message or _unread_line(scheduler, queue)
        if scheduler == "kueue":
            workload = workload_of(pod, listed)
            position = kueue_position(workload, listed) if workload is not None else None
            return kueue_queue_line(queue, workload, position)
        podgroup = podgroup_of(pod, listed)
        if podgroup is None or not volcano_queued(podgroup):
            return None  # not yet grouped by Volcano's controller, or let into its queue
        priorities = {
            self.gpu_policy.scheduler.in_quota_priority_class: IN_QUOTA_PRIORITY,
            self.gpu_policy.scheduler.over_quota_priority_class: OVER_QUOTA_PRIORITY,
        }
        position = volcano_position(podgroup, listed, priorities)
        return volcano_queue_line(queue, podgroup, position, await self._volcano_queue_state(queue))

    async def _queue_objects(self, resource: tuple[str, str, str], namespace: str) -> list[dict]:
        """The ``resource`` objects (Workloads, PodGroups) in ``namespace``; one listing
        per poll interval for all spawners, however many servers wait there."""
        listed = await self._shared_read(
            (resource, namespace),
            lambda custom: custom.list_namespaced_custom_object(
                *resource[:2], namespace, resource[2], _request_timeout=self.k8s_api_request_timeout
            ),
        )
        return listed.get("items", [])

    async def _volcano_queue_state(self, queue: str) -> str | None:
        """The state of Volcano's Queue ``queue`` (``Open``, ``Closed``, ...); None when it
        cannot be read (the line then says what it knows without it)."""
        try:
            found = await self._shared_read(
                (VOLCANO_QUEUES, queue),
                lambda custom: custom.get_cluster_custom_object(
                    *VOLCANO_QUEUES, queue, _request_timeout=self.k8s_api_request_timeout
                ),
            )
        except (ApiException, aiohttp.ClientError, OSError, TimeoutError) as e:
            self.log.debug("Reading Volcano queue %s: %s", queue, e)
            return None
        return (found.get("status") or {}).get("state")

    async def _shared_read(self, key: tuple, request: Callable[[CustomObjectsApi], Awaitable]):
        """``request``'s answer, made at most once per poll interval for every spawner."""
        now = asyncio.get_running_loop().time()
        cached = GPUKubeSpawner._queue_listings.get(key)
        if cached is None or now - cached[0] >= self.wait_poll_interval:
            answer = asyncio.ensure_future(request(CustomObjectsApi(self.api.api_client)))
            # an answer whose every reader was cancelled still has its error read
            answer.add_done_callback(lambda f: f.cancelled() or f.exception())
            cached = GPUKubeSpawner._queue_listings[key] = (now, answer)
        return await asyncio.shield(cached[1])

    async def poll(self):
        """None while the server's pod exists, as KubeSpawner says; and None when the
        API server cannot be reached to know.

        JupyterHub forgets a server whose poll says it stopped; at a hub start with the
        API server unreachable, KubeSpawner's first list of pods fails and every running
        server would be forgotten, while its pod lives on, charged. A pod list that
        failed is tried again at the next poll, once the API server answers.
        """
        try:
            await self._pods_listed()
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self.log.warning(
                "Cannot reach the Kubernetes API server to poll %s (%s): taking it as "
                "still running until it can be checked",
                self._log_name,
                e,
            )
            return None
        return await super().poll()

    async def _pods_listed(self) -> None:
        """KubeSpawner's pod reflector, started again if it failed.

        Its first list fails while the API server is unreachable, and its watch gives
        up for good after about 50 s of failed retries; either way it would go on
        answering from a stale list (a new pod never seen, a spawn waiting out its
        start_timeout) until something replaced it.
        """
        reflector = self.reflectors.get(self._get_reflector_key("pods"))
        first_list_failed = (
            reflector is not None
            and reflector.first_load_future.done()
            and not reflector.first_load_future.cancelled()
            and reflector.first_load_future.exception() is not None
        )
        watch = getattr(reflector, "watch_task", None)
        gave_up = watch is not None and watch.done()
        await self._start_watching_pods(replace=first_list_failed or gave_up)

    async def stop(self, now: bool = False) -> None:
        if self._gpu_refused_before_kubernetes:
            # skip KubeSpawner's DELETE of a pod that was never created: in a storm of
            # refused spawns those calls are most of the hub's and the API's work
            self._gpu_refused_before_kubernetes = False
            return
        # KubeSpawner stops a conflicting old pod during start and retries; that stop
        # must not release the reservation the start still holds
        try:
            await super().stop(now=now)
        except Exception as e:
            # the pod may still run (the API server was unreachable, or slow): its GPUs
            # stay charged, and its deletion is retried until the pod is gone
            if not self._gpu_starting:
                self._finish_stop_in_background(e, now)
            raise
        if not self._gpu_starting:
            self.admission.record_stop(self._server_key)
            await self._release()

    def _finish_stop_in_background(self, error: Exception, now: bool) -> None:
        """After a failed stop: delete this server's pod until it is gone, then release.

        JupyterHub forgets the server either way, so nothing else would delete the
        pod; and releasing its charge while it runs would let a group exceed its
        quota. The deletion names the pod's uid: a new pod of the same name (the user
        started again) is never touched, and its own charge never released.
        """
        key = self._server_key
        charge = self.admission.charge(key)
        pod = self.pod_reflector.pods.get(key) if getattr(self, "pod_reflector", None) else None
        uid = ((pod or {}).get("metadata") or {}).get("uid")
        self.log.warning(
            "Stopping %s failed (%s); its pod %s stays charged and is deleted when the "
            "Kubernetes API answers",
            self._log_name,
            error,
            key,
        )
        self.admission.finish_in_background(
            self._delete_until_gone(self.namespace, self.pod_name, uid, charge, now)
        )

    async def _delete_until_gone(
        self, namespace: str, name: str, uid: str | None, charge: Charge | None, now: bool
    ) -> None:
        options = V1DeleteOptions(
            grace_period_seconds=0 if now else self.delete_grace_period,
            preconditions=V1Preconditions(uid=uid) if uid else None,
        )
        delay = 1.0
        while True:
            try:
                await self.api.delete_namespaced_pod(
                    name, namespace, body=options, _request_timeout=self.k8s_api_request_timeout
                )
            except ApiException as e:
                if e.status in (404, 409):  # gone, or a new server's pod has the name now
                    break
                self.log.warning("Deleting pod %s/%s: %s", namespace, name, exception_message(e))
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass  # still unreachable
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10)
        key = f"{namespace}/{name}"
        self.admission.record_stop(key, uid=uid)
        if charge is not None:
            await self.admission.release(self.gpu_policy, key, only=charge)
        self.log.info("Pod %s is gone: the stop of %s is complete", key, self._log_name)

    async def get_pod_manifest(self):
        # KubeSpawner's pod itself, shaped in place: a modify_pod_hook gets what
        # KubeSpawner would give it, and every field KubeSpawner would send is sent
        pod = await super().get_pod_manifest()
        if self.gpu_shape is not None:
            apply_to_pod(pod, self.gpu_shape)
        return pod

    async def progress(self):
        # while waiting in line there is no pod yet: report the queue position
        while self._gpu_wait_message:
            yield {"progress": 1, "message": self._gpu_wait_message}
            await asyncio.sleep(1)
        # KubeSpawner's events, and whenever it changes, where the pod waits in its
        # scheduler's queue (a pod Kueue gates has no events of its own to show)
        events: asyncio.Queue = asyncio.Queue()
        done = object()

        async def forward() -> None:
            try:
                async for event in super(GPUKubeSpawner, self).progress():
                    if self._queue_wait_message and not {"raw_event", "progress"} & set(event):
                        # KubeSpawner's "please be patient" would take the place of the
                        # line that says where the server waits
                        continue
                    await events.put(self._explained(event))
            finally:
                await events.put(done)

        forwarding = asyncio.ensure_future(forward())
        shown = None
        try:
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), timeout=1)
                except TimeoutError:
                    event = None
                if event is done:
                    break
                if event is not None:
                    yield event
                line = self._queue_wait_message
                if line and line != shown:
                    yield {"message": line}  # no "progress": the bar stays where it is
                shown = line
        finally:
            forwarding.cancel()
        await forwarding  # KubeSpawner's errors, if any, are the page's

    def _explained(self, event: dict[str, Any]) -> dict[str, Any]:
        """A scheduler's FailedScheduling event, said in plain language."""
        raw = event.get("raw_event") or {}
        if raw.get("reason") != "FailedScheduling" or self.gpu_selection is None:
            return event
        resources = tuple(self.gpu_shape.extended_resources) if self.gpu_shape else ()
        text = explain_unschedulable(raw.get("message") or "", self.gpu_selection.flavor, resources)
        return {**event, "message": text} if text else event


def _not_a_hub_failure(spawner: GPUKubeSpawner) -> None:
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


def _queue_of(scheduler: str, pod: dict) -> str:
    """The queue ``pod`` names: Kueue's LocalQueue label, Volcano's queue annotation."""
    metadata = pod.get("metadata") or {}
    if scheduler == "volcano":
        return (metadata.get("annotations") or {}).get(VOLCANO_QUEUE_ANNOTATION, "?")
    return (metadata.get("labels") or {}).get(QUEUE_LABELS[scheduler], "?")


def _unread_line(scheduler: str, queue: str) -> str:
    """The line while the scheduler's objects cannot be read: where, not which place."""
    if scheduler == "kueue":
        return kueue_queue_line(queue, None, None)
    return (
        f"waiting in Volcano queue {queue}. The server starts by itself when Volcano lets "
        "it in; stop it to give up."
    )


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 20 min``, ``2 d 4 h``."""
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _applied_in_load_user_options(spawner: GPUKubeSpawner, user_options: dict) -> None:
    """user_options are checked against the policy and applied in ``load_user_options``."""


_MERGED_TRAITS = (
    "cpu_limit",
    "mem_limit",
    "extra_resource_guarantees",
    "extra_resource_limits",
    "node_selector",
    "tolerations",
)


def _unreachable(error: Exception) -> SpawnRefused:
    return SpawnRefused(
        f"the Kubernetes API server could not be reached ({type(error).__name__}); "
        "nothing was started: try again in a minute, and tell an admin if it persists",
        503,
    )


@contextlib.contextmanager
def _kubernetes_reachable():
    """An unreachable API server becomes one line for the user (503), not a traceback."""
    try:
        yield
    except (aiohttp.ClientError, OSError) as e:
        raise _unreachable(e) from None
