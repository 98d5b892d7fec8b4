"""``GPUPolicy``: the one place an admin describes GPUs and groups.

Read from ``hub.config.GPUPolicy`` in z2jh values (or ``c.GPUPolicy`` in a
plain ``jupyterhub_config.py``) by the hub's spawner and by the service alike.
The traits hold the raw mappings exactly as YAML gives them; ``model`` checks
them all at once and returns the frozen policy model, or raises ``PolicyError``
listing every problem with its key path.
"""

from __future__ import annotations

from traitlets import Bool, Dict, Enum, List, Unicode, Union, default, observe, validate
from traitlets.config import Configurable

from ..core.model import PREFIX, Policy, PolicyError, parse_policy, unknown_settings


class GPUPolicy(Configurable):
    scheduler = Union(
        [Unicode(), Dict()],
        help="""
        The cluster's scheduler and the priority classes pods get: a mapping,
        or just the scheduler's name (``scheduler: kai`` is ``{name: kai}``).

        ``name`` is ``default`` (kube-scheduler, PriorityClass only), ``kai``
        (``schedulerName: kai-scheduler``, label ``kai.scheduler/queue``),
        ``volcano`` (``schedulerName: volcano``, annotation
        ``scheduling.volcano.sh/queue-name``) or ``kueue`` (label
        ``kueue.x-k8s.io/queue-name``, a LocalQueue per group).

        ``in_quota_priority_class`` and ``over_quota_priority_class`` name the
        PriorityClasses of pods within their group's quota and of pods bursting
        between quota and limit (preemptible). Defaults: KAI's ``build`` and
        ``build-preemptible``; otherwise ``jupyterhub-gpu-in-quota`` and
        ``jupyterhub-gpu-over-quota``, which the service creates.
        """,
    ).tag(config=True)

    flavors = Dict(
        help="""
        What the cluster offers, by name. Each flavor has a ``kind``:

        - ``gpu``: whole GPUs (``resource``, default ``nvidia.com/gpu``); 1 GPU-equivalent.
          ``device_class`` says a DRA driver serves ``resource`` through that
          DeviceClass's ``extendedResourceName`` (the extended-resource bridge)
          instead of a device plugin.
        - ``mig``: a MIG slice (``profile`` such as ``1g.5gb``; ``strategy`` ``mixed``
          requests ``nvidia.com/mig-<profile>``, ``single`` requests ``nvidia.com/gpu``
          on nodes labelled ``<product>-MIG-<profile>``); slices/7 GPU-equivalents.
        - ``timeslice`` / ``mps``: a shared replica (``replicas``; ``resource``
          default ``nvidia.com/gpu.shared``); 1/replicas GPU-equivalents.
        - ``fraction``: a KAI GPU share (``gpu_fraction`` or ``gpu_memory`` MiB,
          ``device_memory`` MiB to count it); needs ``scheduler.name: kai``.
        - ``hami``: a HAMi vGPU (``gpu_memory`` MiB, ``gpucores`` %, ``device_memory``).
        - ``dra``: a Dynamic Resource Allocation claim (``device_class``,
          ``selectors``, ``sharing``, ``gpu_equivalents`` per device).

        Every flavor may set ``display_name``, ``node_selector``, ``tolerations``
        (default: tolerate the ``nvidia.com/gpu`` taint) and ``runtime_class_name``.
        """,
    ).tag(config=True)

    profiles = Dict(
        help="""
        Notebook templates offered to groups, by name: ``display_name``,
        ``description``, ``cpu`` and ``memory`` (Kubernetes quantities: what the
        server is guaranteed and, unless ``cpu_limit`` / ``memory_limit`` raise
        them, at most what it may use), ``image``, ``gpu: {flavor, count}``,
        ``options`` (``gpus: {choices: [1, 2, 4]}``, ``flavor: {choices: [...]}``,
        ``image: {choices: [...]}``; the image option alone may add
        ``unlisted_choice: {validation_regex: ..., display_name: ...}`` so users
        can type an image, checked server-side against the whole regex),
        ``default``, ``interfaces`` (which of ``GPUPolicy.interfaces`` it can
        open) and ``kubespawner_override`` for anything the policy does not
        account (environment, ...; shared data is ``datasets``).
        """,
    ).tag(config=True)

    everyone = Dict(
        help="""
        What every authenticated user is offered, as a group named ``everyone``:
        ``profiles``, and optionally ``quota``, ``limit``, ``per_user``,
        ``max_runtime``, ``interfaces`` and ``datasets``.
        """,
    ).tag(config=True)

    groups = Dict(
        help="""
        JupyterHub groups (from the identity provider or the hub's own admin), by
        name: ``profiles`` they may use; ``quota`` (guaranteed: ``gpus`` in
        GPU-equivalents, per-flavor device counts under ``flavors``, ``cpu``,
        ``memory``, ``servers``); ``limit`` (burst ceiling, >= quota: pods
        between quota and limit are over-quota and preemptible); ``per_user``
        caps; ``max_runtime`` (e.g. ``8h``); ``queue`` (default: the group's
        name); ``parent`` (whose quota and limit cap the sum of its children);
        ``priority_class``; ``unlimited``; ``admin``; ``display_name``.

        GPU time: ``budget: {gpu_hours: 2000, period: 30d}`` caps the
        GPU-equivalent-hours the group's servers use in a rolling window (a
        parent's budget caps the sum of its children's); ``per_user.budget`` does
        the same for each member. When a budget is used up, new GPU servers are
        refused with the numbers and the time room comes back; running ones are
        warned (``when_exhausted: warn``, the default) or, with
        ``when_exhausted: stop``, stopped after ``grace`` (default 15m).
        ``idle: {after: 2h, gpu_utilization_below: 5}`` stops servers whose GPUs
        were idle (utilisation below that percentage) for that long, after a notice.

        Fair share (with ``fair_share``): ``share`` (a number above 0, default
        1) is the group's weight among its siblings, the groups of the same
        parent (or the top-level groups); its members have equal shares of it.

        ``when_full`` (``refuse`` or ``wait``) is what its members' spawns do
        when a cap is reached, its own or a parent's; unset, its parent's
        setting applies, else ``GPUPolicy.when_full``.

        What servers open and mount: ``interfaces`` (names from
        ``GPUPolicy.interfaces``) and ``datasets`` (names from
        ``GPUPolicy.datasets``; a server mounts its group's and its parents').
        """,
    ).tag(config=True)

    when_full = Enum(
        ["refuse", "wait"],
        default_value="refuse",
        help="""
        What a spawn that does not fit its group's limit does: ``refuse`` at once
        with the numbers, or ``wait`` in line until capacity frees (the spawn
        page shows its position): first come, first served, or with
        ``fair_share`` whoever used less GPU time recently first.

        A group's own ``when_full`` overrides this for its members (and its
        subgroups'), so a course can refuse at once while research waits.
        A spawn over a per-user cap is always refused: only the user can free it.
        """,
    ).tag(config=True)

    fair_share = Dict(
        None,
        allow_none=True,
        help="""
        Order who waits for the same capacity by GPU time used recently, against
        their share: ``{half_life: 7d, max_wait: 30m}``.

        Each group's and member's GPU-hours are decayed with ``half_life`` (use a
        half-life ago counts half, two half-lives ago a quarter) and divided by
        their share (a group's ``share`` among its siblings; members equal
        within their group). With ``when_full: wait``, whoever has used less of
        their share goes first, arrival order breaks ties, and a server that has
        waited longer than ``max_wait`` (default 1h) goes first whatever its
        standing, so nobody waits for ever. Unset (the default): the line is
        first come, first served.
        """,
    ).tag(config=True)

    @default("fair_share")
    def _first_come_first_served(self) -> None:
        # traitlets would make an unset Dict {}: unset is off, not "on with no settings"
        return None

    interfaces = Dict(
        help="""
        What a server can open, by name: ``{display_name, url}``, where ``url``
        is a path on the user's server, for example

        .. code-block:: yaml

            interfaces:
              lab:    {display_name: JupyterLab, url: /lab}
              vscode: {display_name: VS Code, url: /vscode/}

        VS Code needs ``jupyter-vscode-proxy`` and code-server in the
        single-user image; any other ``jupyter-server-proxy`` app is named by
        its URL the same way. A group's or profile's ``interfaces: [lab,
        vscode]`` says which of them its servers offer (both set: those in
        both); where neither says, the first one here. With more than one, the
        spawn form offers the choice as the option ``interface``, and the server
        opens at its URL (its ``default_url``). A spawn naming an interface its
        group does not offer is refused.

        Unset (the default): the policy does not choose, and servers open at the
        chart's ``singleuser.defaultUrl``.
        """,
    ).tag(config=True)

    datasets = Dict(
        help="""
        Shared data the servers of some groups mount, by name. Each is one of

        - ``nfs: {server, path}``: an NFS export, mounted inline, so it mounts
          in any namespace;
        - ``claim: <name>``: an existing PersistentVolumeClaim in the server's
          namespace (with ``namespace_per_group``, each group's own namespace);
        - ``csi: {driver, volume_attributes, fs_type}``: an inline CSI volume,
          for drivers that support ephemeral inline volumes (csi-driver-nfs,
          for example); a driver that serves PersistentVolumes only (most
          Lustre and GPFS drivers) needs a claim, named with ``claim:``;

        with ``mount_path`` (required, absolute) and ``read_only`` (default
        false), and optionally ``display_name`` and ``description``:

        .. code-block:: yaml

            datasets:
              imagenet: {nfs: {server: nfs.example.edu, path: /export/imagenet},
                         mount_path: /data/imagenet, read_only: true}
              scratch:  {claim: research-scratch, mount_path: /data/scratch}

        A group's ``datasets: [imagenet, scratch]`` names what its servers mount
        (its parents' datasets too). Nothing in a user's options adds or
        changes a mount. A claim missing from a server's namespace refuses the
        spawn with its name, and the GPU service reports it. Users' homes stay
        the chart's (``singleuser.storage``); a dataset may not be mounted where
        one of the chart's volumes is.
        """,
    ).tag(config=True)

    namespace_per_group = Bool(
        False,
        help="""
        Put each group's servers in a namespace of its own
        (``namespace_prefix`` + group name), where the service keeps the group's
        ResourceQuota, LimitRange and NetworkPolicy.

        A group's namespace may never be one of Kubernetes' own (``default``,
        ``kube-system``, ``kube-public``, ``kube-node-lease``, any ``kube-*``)
        nor the hub's: the hub, the service and ``jupyterhub-gpu check`` refuse
        such a policy. An existing namespace the service did not make is never
        taken over unless ``adopt_namespaces`` lists it.
        """,
    ).tag(config=True)

    namespace_prefix = Unicode(
        "jupyterhub-gpu-",
        help="""
        Prefix of the per-group namespaces (with ``namespace_per_group``): group
        ``research`` runs in ``jupyterhub-gpu-research``. An empty prefix makes
        the group's name its namespace's; a prefix starting with ``kube-`` is refused.
        """,
    ).tag(config=True)

    adopt_namespaces = List(
        help="""
        Existing namespaces the service may take over as group namespaces, e.g.
        ``[jupyterhub-gpu-research]`` when a namespace was made by hand before
        ``namespace_per_group`` was turned on.

        The service writes only into namespaces it made itself (labelled
        ``app.kubernetes.io/managed-by: jupyterhub-gpu`` and
        ``gpu.jupyterhub.org/hub-namespace: <the hub's namespace>``). A group
        namespace that already exists without those labels (a typo in a group's
        name or ``namespace_prefix`` must not take over somebody's namespace) is
        left untouched and reported, with no quota, network policy or label
        written, until it is listed here. Once adopted it carries the labels like
        any namespace the service made (``prune_namespaces`` may then delete it
        when the group is dropped). Only the policy's own group namespaces may be
        listed.
        """,
    ).tag(config=True)

    egress = Dict(
        None,
        allow_none=True,
        help="""
        What servers in group namespaces may connect to (with
        ``namespace_per_group``). Unset (the default): not restricted, servers
        reach whatever the cluster's network lets them reach. Set, each group
        namespace gets a NetworkPolicy ``jupyterhub-gpu-egress``:

        .. code-block:: yaml

            egress:
              deny_private: true                 # default
              allow_cidrs: [10.20.30.0/24]       # e.g. a licence server
              deny_cidrs: [130.92.0.0/16]        # e.g. the site's own public range
              allow_public: true                 # default
              allow_dataset_servers: true        # default

        Always allowed: DNS (port 53 to the cluster DNS in ``kube-system`` and
        NodeLocal DNSCache's 169.254.20.10), the hub and proxy pods in the hub's
        namespace, and pods of the same group namespace. ``deny_private`` denies
        the private ranges 10.0.0.0/8, 172.16.0.0/12 and 192.168.0.0/16, the
        shared range 100.64.0.0/10, link-local 169.254.0.0/16 (the cloud
        metadata service) and IPv6's fc00::/7 and fe80::/10: storage nodes,
        databases, the nodes and internal services. ``deny_cidrs`` adds
        networks to deny; ``allow_cidrs`` allows networks even inside denied
        ones; ``allow_public: false`` denies every address not allowed (the
        public internet too). ``allow_dataset_servers`` allows the NFS servers
        of a group's ``datasets`` written as addresses (the mount is made by
        the node, which this rule does not govern, so ``false`` is stricter and
        mounts still work). The cluster's network plugin must enforce
        NetworkPolicy (Calico, Cilium, ...).
        """,
    ).tag(config=True)

    @default("egress")
    def _egress_unrestricted(self) -> None:
        # traitlets would make an unset Dict {}: unset is off, {} is on with the defaults
        return None

    extra_labels = Dict(
        help="""
        Extra pod labels, as templates with ``{username}``, ``{group}``,
        ``{profile}``, ``{flavor}`` and ``{servername}``; for example
        ``{team: "{group}", user: "{username}", job_type: notebook}``.
        """,
    ).tag(config=True)

    adopted_servers_group = Unicode(
        None,
        allow_none=True,
        help="""
        The group charged for a running server that was started before the policy
        (by stock KubeSpawner, so its pod has none of the policy's labels), when
        the user's groups do not single one out.

        Such servers are found when the hub starts and counted from then on, so a
        group cannot be admitted its whole quota on top of them: each is charged
        to the only one of its user's groups that offers its GPU flavor (for a
        server without GPUs, the only one that offers a profile without GPUs);
        otherwise to this group; with neither, to no group (the hub log names
        it). They are never stopped or preempted because of the switch (see
        ``adopted_servers_preemptible``).
        """,
    ).tag(config=True)

    adopted_servers_preemptible = Bool(
        False,
        help="""
        Whether new servers may preempt servers started before the policy.

        Those servers' pods have no PriorityClass (priority 0), and the policy's
        servers get ``jupyterhub-gpu-in-quota`` (1000) or
        ``jupyterhub-gpu-over-quota`` (100), so on a full node kube-scheduler
        would evict an old server, and its user's running kernels, to place a
        new one. By default (``False``), while any server from before the policy
        runs, a new server gets the same class's twin that never preempts
        (``jupyterhub-gpu-in-quota-no-preemption``, ``preemptionPolicy:
        Never``, same value): it waits for room instead. A group's own
        ``priority_class`` and a scheduler's own classes (KAI's) are used as
        they are. ``True``: new servers preempt as they would without old ones.
        """,
    ).tag(config=True)

    accounting_url = Unicode(
        "sqlite:///jupyterhub-gpu-usage.sqlite",
        help="""
        The database GPU usage is recorded in (an SQLAlchemy URL): one row per
        server pod with its GPU-equivalents, start and end. The hub writes a
        server's start and stop; the service records every GPU pod it sees and
        closes those that ended while the hub was not looking. Budgets, history
        and showback are read from it, so it must outlive hub restarts. A
        relative sqlite path is relative to the hub's working directory (the
        service the hub starts shares it): in a z2jh hub pod that is
        ``/srv/jupyterhub``, the hub's volume, beside ``jupyterhub.sqlite``.
        Or point it at the hub's PostgreSQL.
        """,
    ).tag(config=True)

    accounting_fail_open = Bool(
        False,
        help="""
        What a GPU spawn does when the usage database cannot be read or written and
        a budget applies to it: refuse (``False``, the default: no budget can be
        exceeded unseen) or admit without the budget check (``True``: availability
        first). It holds from any failed read or write until what was kept is
        written and the rows are read again. The dashboard shows which is in force
        while the database is unavailable.
        """,
    ).tag(config=True)

    _model: Policy | None = None

    @default("scheduler")
    def _default_scheduler(self) -> dict:
        return {"name": "default"}

    @validate("scheduler")
    def _scheduler_by_name(self, proposal) -> dict:
        value = proposal["value"]
        return {"name": value} if isinstance(value, str) else value

    @observe(
        "scheduler",
        "flavors",
        "profiles",
        "everyone",
        "groups",
        "when_full",
        "namespace_per_group",
        "namespace_prefix",
        "extra_labels",
        "adopted_servers_group",
        "adopted_servers_preemptible",
        "fair_share",
        "interfaces",
        "datasets",
        "adopt_namespaces",
        "egress",
    )
    def _settings_changed(self, change) -> None:
        self._model = None  # the next read of ``model`` checks the new settings

    @property
    def model(self) -> Policy:
        """The checked policy; raises ``PolicyError`` listing every problem."""
        if self._model is None:
            given = self.config.GPUPolicy if "GPUPolicy" in self.config else {}
            unknown = unknown_settings(PREFIX, given, self.trait_names(config=True))
            try:
                model = parse_policy(
                    scheduler=self.scheduler,
                    flavors=self.flavors,
                    profiles=self.profiles,
                    everyone=self.everyone,
                    groups=self.groups,
                    when_full=self.when_full,
                    namespace_per_group=self.namespace_per_group,
                    namespace_prefix=self.namespace_prefix,
                    extra_labels=self.extra_labels,
                    adopted_servers_group=self.adopted_servers_group,
                    adopted_servers_preemptible=self.adopted_servers_preemptible,
                    fair_share=self.fair_share,
                    interfaces=self.interfaces,
                    datasets=self.datasets,
                    adopt_namespaces=self.adopt_namespaces,
                    egress=self.egress,
                )
            except PolicyError as e:
                raise PolicyError(unknown + e.errors) from None
            if unknown:
                raise PolicyError(unknown)
            self._model = model
        return self._model
