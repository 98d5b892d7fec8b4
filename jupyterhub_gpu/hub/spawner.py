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

The class is the spawn path's order; its parts are the hub room's other modules: the
checks and refusals (``checks``), the profile list (``profiles``), the ledger
(``admission``) and the server pods it is rebuilt from (``pods``), the wait in a
scheduler's queue (``queue_watch``) and the spawn page's events (``progress``). What
differs between schedulers is ``core.schedulers``'.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiException
from kubespawner import KubeSpawner
from traitlets import Any as AnyValue
from traitlets import Bool, Float, Unicode, default, validate

from ..accounting.store import UsageStore
from ..config.policy import GPUPolicy
from ..config.service_settings import SERVER_TOKEN_SCOPES, SERVICE_URL_ENV, gpu_service_url
from ..core.admission import OVER_QUOTA, Charge, Decision, Ledger
from ..core.model import Policy, PolicyError
from ..core.objects import namespace_for
from ..core.profiles import disabled_slugs, disabling_script, without_overrides
from ..core.selection import Selection
from ..core.shaping import (
    MERGED_SETTINGS,
    PodShape,
    merge_settings,
    shape,
)
from ..kube.client import exception_message
from .admission import SpawnAdmission, register_hub_metrics
from .checks import (
    SpawnRefused,
    checked_policy,
    kubernetes_reachable,
    kubernetes_refused,
    not_a_hub_failure,
    refuse_a_site_profile_list,
    refuse_missing_claims,
    refuse_mount_collisions,
    selected,
    unreachable,
)
from .devices import ServerDevices
from .metrics import count_refusal
from .pods import charges_from_pods, finish_stop_in_background, shaped_manifest, watch_pods
from .profiles import offered_profiles
from .progress import explained, progress_events
from .queue_watch import QueueWatch
from .server_end import ServerEnd
from .server_exit import ServerExited, exited_refusal, raise_if_exited, wait_until_serving


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

    check_dataset_claims = Bool(
        True,
        help="""
        Before a spawn, check that each PersistentVolumeClaim the group's
        datasets name exists in the server's namespace, and refuse the spawn
        naming a missing one (its pod would otherwise wait in Pending until the
        start times out). Needs ``get`` on persistentvolumeclaims there, which
        the chart grants in the hub's namespace and ``jupyterhub-gpu manifests``
        renders for group namespaces. ``False``: not checked (``jupyterhub-gpu
        pod``, which has no cluster to ask, says so).
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

    gpu_service_url = Unicode(
        help="""
        Where a server's JupyterLab extension reaches the GPU service: each server
        gets it as ``$JUPYTERHUB_GPU_SERVICE_URL`` (unless ``environment`` sets it).
        Default: the hub's service named ``gpu`` (``c.JupyterHub.services``), its
        ``url`` and the hub's ``base_url``, as ``http://hub:10101/services/gpu/`` in
        z2jh; empty (nothing set) where the hub has no such service with a url.
        """,
    ).tag(config=True)

    @default("gpu_service_url")
    def _the_hubs_gpu_service(self) -> str:
        return gpu_service_url(self.config)

    @default("server_token_scopes")
    def _server_tokens_open_the_gpu_service(self) -> list[str]:
        # JupyterHub's defaults (the server's own activity and access) plus access to
        # the GPU service, where the server's JupyterLab reads its own GPU time; a
        # site's own server_token_scopes must add access:services!service=gpu itself
        return list(SERVER_TOKEN_SCOPES) if self.gpu_service_url else []

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        if self.gpu_service_url:
            env.setdefault(SERVICE_URL_ENV, self.gpu_service_url)
        return env

    #: the admission every spawner of this hub shares (see ``admission``)
    _hub_admission: SpawnAdmission | None = None
    #: this spawner's own admission instead: offline rendering and tests give one
    _own_admission: SpawnAdmission | None = None
    _policies: dict[int, tuple[Any, Policy]] = {}
    #: what the spawn page shows while this spawn waits in its group's line
    _gpu_wait_message: str | None = None
    #: true from start() until the pod exists or the start failed
    _gpu_starting: bool = False
    #: the server's DRA devices, as its start and the hub's DRA watch name them
    _devices: ServerDevices
    #: when JupyterHub stops waiting for the current start (time.monotonic())
    _gpu_start_deadline: float = 0.0
    #: http_timeout as configured: a start that waited for the server's port leaves
    #: JupyterHub's own wait for it only the rest (see _start_charged)
    _gpu_http_timeout: float | None = None
    #: the charge this server's current start made (released if the start fails)
    _gpu_reservation: Charge | None = None
    #: the last start was refused before anything was written to Kubernetes
    _gpu_refused_before_kubernetes: bool = False
    #: the group the current start is charged to, once its options chose one (a
    #: refusal is counted under it)
    _gpu_start_group: str = ""
    #: this spawner's starts while its scheduler holds the server's pod in a queue
    _queue_watch: QueueWatch
    #: KubeSpawner is applying validated options (it reads the profile list for them)
    _gpu_applying_options: bool = False
    #: the server's pod as this hub last saw it, and the end of its GPU time
    _server_end: ServerEnd
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

    def _refuse_a_site_profile_list(self) -> None:
        """Refuse the spawn when the site set a profile_list of its own."""
        if getattr(self.profile_list, "__func__", None) is not GPUKubeSpawner._gpu_profile_list:
            refuse_a_site_profile_list(self, self.profile_list)

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
            register_hub_metrics(admission)
        return GPUKubeSpawner._hub_admission

    def __init__(self, *args: Any, admission: SpawnAdmission | None = None, **kwargs: Any) -> None:
        """``admission``: this spawner's own instead of the hub's shared one (offline
        rendering admits against an empty cluster of its own)."""
        self._own_admission = admission
        super().__init__(*args, **kwargs)
        self._queue_watch = QueueWatch(self)
        self._server_end = ServerEnd(self)
        self._devices = ServerDevices(self)
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
                return  # every spawn reports the broken policy itself (checked_policy)
            self.admission.begin_rebuild(policy, self._listed_charges, self.ledger_resync_interval)

    async def _ledger(self, policy: Policy) -> Ledger:
        """The shared ledger, rebuilt from pod labels the first time it is needed."""
        return await self.admission.ready_ledger(
            policy, self._listed_charges, self.ledger_resync_interval
        )

    async def ready_ledger(self) -> Ledger:
        """The shared ledger under this hub's policy (``ports.EndingServer``)."""
        return await self._ledger(self.gpu_policy)

    def pod_watch(self) -> Any:
        """KubeSpawner's pod reflector for this spawner's namespace, if started."""
        return self.reflectors.get(self._get_reflector_key("pods"))

    async def restart_pod_watch(self, replace: bool) -> None:
        """KubeSpawner's pod watch started, or replaced when ``replace``."""
        await self._start_watching_pods(replace=replace)

    async def _listed_charges(self, policy: Policy) -> list[Charge]:
        with kubernetes_reachable():
            return await self._charges_from_pods(policy)

    async def _charges_from_pods(self, policy: Policy) -> list[Charge]:
        return await charges_from_pods(self, policy, self._hub_namespace)

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
        policy = checked_policy(self)
        ledger = await self._ledger(policy)
        # a spawn resolves its profile from this list too, and needs no capacity for
        # it: only the form a person reads waits for the first list of nodes and pods
        return await offered_profiles(self, policy, ledger, wait=not self._gpu_applying_options)

    def _render_options_form(self, profile_list):
        self._refuse_a_site_profile_list()
        # Every form template gets the list as a user may read it. KubeSpawner's own
        # shows no overrides, but jupyterhub-fancy-profiles hands the whole list to
        # the browser as JSON; load_user_options still applies the full entries.
        if not isinstance(self.user_options, Mapping):
            self.user_options = {}  # saved options that were never valid: no preselection
        disabled = disabled_slugs(profile_list)
        saved = self.user_options
        if saved.get("profile") in disabled:
            # the last server's profile is used up: the form preselects the default
            # (the saved options themselves are JupyterHub's, and kept)
            self.user_options = {}
        try:
            form = super()._render_options_form(without_overrides(profile_list))
        finally:
            self.user_options = saved
        return form + disabling_script(disabled)

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
        policy = checked_policy(self)
        self._refuse_a_site_profile_list()
        selection = selected(self, policy, self._user_groups())
        self._gpu_start_group = selection.group.name
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
        # the group's datasets: where they mount, and that their claims exist
        refuse_mount_collisions(self, policy, selection.group.name)
        if self.check_dataset_claims:
            await refuse_missing_claims(self, policy, selection.group.name, self.namespace)
        decision = await self._admit(policy, selection)
        self.gpu_selection = selection
        self.gpu_shape = shape(
            policy,
            selection,
            decision.tier,
            username=self.user.name,
            servername=self.name or "",
            hub=self._hub_namespace,
            # servers from before the policy have priority 0: a new one that could
            # preempt would take them first, unless an admin allows it
            preempt=policy.adopted_servers_preemptible or not self.admission.servers_before_policy,
            # with fair share, the heaviest users' bursts are the scheduler's first victims
            burst_band=(
                self.admission.burst_band(policy, self.user.name, selection.group.name)
                if decision.tier == OVER_QUOTA
                else None
            ),
        )
        current = {key: getattr(self, key) for key in MERGED_SETTINGS}
        for key, value in merge_settings(current, self.gpu_shape).items():
            setattr(self, key, value)

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
            raise SpawnRefused(decision.reason, kind=decision.kind)
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
        # a server its scheduler may hold in a queue must outlast JupyterHub's bound
        self._queue_watch.lengthen_start_timeout()
        self._gpu_start_deadline = time.monotonic() + self.start_timeout
        if self._gpu_http_timeout is None:
            self._gpu_http_timeout = self.http_timeout
        self.http_timeout = self._gpu_http_timeout
        return super().start()

    def is_pod_running(self, pod):
        # a container that exits before it is ever ready ends the start now, not after
        # start_timeout (KubeSpawner's poll reads the exit of a server that ran)
        if self._gpu_starting:
            raise_if_exited(pod)
        return super().is_pod_running(pod)

    async def _start(self):
        self._gpu_start_group = ""
        try:
            return await self._queue_watch.bounded(self._start_charged())
        except SpawnRefused as e:
            # on the hub's /hub/metrics, for the refused-spawns alert
            count_refusal(self._gpu_start_group, e)
            if e.status_code < 500:
                not_a_hub_failure(self)
            raise

    async def _start_charged(self):
        self._gpu_starting = True
        self._gpu_reservation = None
        self._devices.begin()  # this start's DRA devices, named once allocated
        # a new pod: what was seen of the last one says nothing of it
        self._server_end.new_start()
        try:
            # a pod watch that gave up during an outage would never see this pod
            with kubernetes_reachable():
                await watch_pods(self)
            result = await super()._start()
            # a process that exits once its pod runs fails the start too, saying why;
            # the wait ends before JupyterHub's own bounds would end it, and JupyterHub's
            # wait for the server (read as start returns) gets only what is left of it
            began = time.monotonic()
            until = min(self._gpu_start_deadline, began + self.http_timeout) - 1
            await wait_until_serving(self, result, self._server_key, until)
            # http_timeout is an Int trait: a float left over would fail every start
            left = self.http_timeout - (time.monotonic() - began)
            self.http_timeout = max(math.ceil(left), 5)
        except ServerExited as e:
            await self._release_reservation()
            raise await exited_refusal(self, e) from None
        except ApiException as e:
            await self._release_reservation()
            if e.status == 403:
                # e.g. a namespace ResourceQuota or a missing PriorityClass: say which
                raise kubernetes_refused(exception_message(e)) from None
            raise
        except (aiohttp.ClientError, OSError) as e:
            await self._release_reservation()
            raise unreachable(e) from None
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
            # a DRA server's GPU time counts what its claims were allocated
            self.admission.record_start(
                self.gpu_policy, pod, await self._devices.start_allocation(pod)
            )
            self._server_end.note_pod()
        return result

    async def poll(self):
        """None while the server's pod exists, as KubeSpawner says; and None when the
        API server cannot be reached to know.

        JupyterHub forgets a server whose poll says it stopped; at a hub start with the
        API server unreachable, KubeSpawner's first list of pods fails and every running
        server would be forgotten, while its pod lives on, charged. A pod list that
        failed is tried again at the next poll, once the API server answers.

        A server found stopped (its pod gone: deleted, evicted; at a hub start, gone
        while the hub was down) ends its GPU time here, at its pod's own end or last
        sighting, and frees its charge: JupyterHub calls no ``stop`` for it.
        """
        try:
            await watch_pods(self)
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self.log.warning(
                "Cannot reach the Kubernetes API server to poll %s (%s): taking it as "
                "still running until it can be checked",
                self._log_name,
                e,
            )
            return None
        # before KubeSpawner's poll, which deletes a pod whose server exited
        self._server_end.note_pod()
        status = await super().poll()
        running = self.server is not None  # as JupyterHub holds it
        end = self._server_end
        if status is not None and running and not self._gpu_starting and not end.ended:
            # JupyterHub stops a server its poll finds stopped without calling stop()
            # (it has nothing left to stop): its GPU time ends, and its charge goes, now
            found = end.found_ended(self.admission.clock())
            if found is not None:
                await end.record(found[0], found)
                await self._release()
        return status

    async def stop(self, now: bool = False) -> None:
        if self._gpu_refused_before_kubernetes:
            # skip KubeSpawner's DELETE of a pod that was never created: in a storm of
            # refused spawns those calls are most of the hub's and the API's work
            self._gpu_refused_before_kubernetes = False
            return
        # a stop the hub asks for ends the server's GPU time when asked (the pod's
        # grace to exit is not the user's); a server found stopped, when its pod ended
        asked_at = self.admission.clock()
        found = None if self._gpu_starting else self._server_end.found_ended(asked_at)
        # KubeSpawner stops a conflicting old pod during start and retries; that stop
        # must not release the reservation the start still holds
        try:
            await super().stop(now=now)
        except Exception as e:
            # the pod may still run (the API server was unreachable, or slow): its GPUs
            # stay charged, and its deletion is retried until the pod is gone
            if not self._gpu_starting:
                ended = (asked_at, False) if found is None else (found[0], found[2])
                finish_stop_in_background(self, e, now, ended)
            raise
        if not self._gpu_starting:
            await self._server_end.record(asked_at, found)
            await self._release()

    async def get_pod_manifest(self):
        # KubeSpawner's pod itself, shaped in place: a modify_pod_hook gets what
        # KubeSpawner would give it, and every field KubeSpawner would send is sent
        pod = await super().get_pod_manifest()
        shaped_manifest(pod, self.gpu_shape, getattr(self.orm_spawner, "started", None))
        return pod

    def progress(self):
        # the group's line while the spawn waits in it; then KubeSpawner's events,
        # where the pod waits in its scheduler's queue, and its DRA devices
        return progress_events(
            lambda: self._gpu_wait_message,
            lambda: self._queue_watch.line,
            super().progress,
            lambda event: explained(event, self.gpu_selection, self.gpu_shape),
            device_line=self._devices.line,
            devices_read=self._devices.wait_read,
        )


def _applied_in_load_user_options(spawner: GPUKubeSpawner, user_options: dict) -> None:
    """user_options are checked against the policy and applied in ``load_user_options``."""
