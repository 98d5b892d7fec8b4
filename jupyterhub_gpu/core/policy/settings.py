"""The policy's settings, ``GPUPolicy.<name>``: each declared once, as the keys inside
them are (``keys``); ``GPUPolicy``'s traits take their help and defaults from here.
Pure: no I/O.
"""

from __future__ import annotations

from . import checks
from .keys import WHEN_FULL
from .schema import Choice, Flag, Key, KeyType, Labels, Text, section

_MAPPING = "mapping: name → {}"

SETTINGS = section(
    "GPUPolicy",
    Key(
        "scheduler",
        KeyType(doc="name, or mapping"),
        "the cluster's scheduler and the priority classes servers get",
        {"name": "default"},
        default_words="`default`",
        details="""
        A mapping, or just the scheduler's name (``scheduler: kai`` is ``{name: kai}``).
        ``default`` is kube-scheduler (PriorityClass only); ``kai`` sets
        ``schedulerName: kai-scheduler`` and the label ``kai.scheduler/queue``;
        ``volcano`` sets ``schedulerName: volcano`` and the annotation
        ``scheduling.volcano.sh/queue-name``; ``kueue`` the label
        ``kueue.x-k8s.io/queue-name``, with a LocalQueue per group. The priority
        classes ``jupyterhub-gpu-in-quota`` and ``jupyterhub-gpu-over-quota`` are
        created by the service.
        """,
    ),
    Key(
        "flavors",
        KeyType(doc=_MAPPING.format("flavor")),
        "what the cluster offers, by name",
        {},
        details="""
        Each flavor has a ``kind``, which says what a unit of it is and what it is
        charged in GPU-equivalents: ``gpu`` (a whole GPU: 1), ``mig`` (a MIG slice:
        slices/7), ``timeslice`` and ``mps`` (a shared replica: 1/replicas),
        ``fraction`` (a KAI GPU share), ``hami`` (a HAMi vGPU) and ``dra`` (a
        Dynamic Resource Allocation claim). A memory-sized share is charged its
        memory over ``device_memory``, or a whole GPU when that is not given.
        """,
    ),
    Key(
        "profiles",
        KeyType(doc=_MAPPING.format("profile")),
        "notebook templates offered to groups, by name",
        {},
        details="""
        ``cpu`` and ``memory`` are what the server is guaranteed and, unless
        ``cpu_limit`` / ``memory_limit`` raise them, the most it may use. The image
        option alone may add ``unlisted_choice`` so users can type an image, checked
        on the hub against the whole regex. ``kubespawner_override`` takes anything
        the policy does not account (environment, ...); shared data is ``datasets``.
        """,
    ),
    Key(
        "everyone",
        KeyType(doc="group"),
        "what every authenticated user is offered, as a group named `everyone`",
        {},
        details="""
        A group's keys (``groups``) but ``parent``, ``unlimited``, ``admin`` and
        ``directory_groups``: every user is in it, whatever the directory says.
        """,
    ),
    Key(
        "groups",
        KeyType(doc=_MAPPING.format("group")),
        "JupyterHub groups, by name, and what their members may use",
        {},
        details="""
        ``quota`` is guaranteed; servers between ``quota`` and ``limit`` (the burst
        ceiling) are over quota and preemptible. A parent's quota and limit cap the
        sum of its children's, and so does its budget. When a budget is used up,
        new GPU servers are refused with the numbers and the time room comes back;
        running ones are warned or, with ``when_exhausted: stop``, stopped after
        ``grace``. ``idle`` stops servers whose GPUs were idle (utilisation below
        the percentage) for that long, after a notice. With ``fair_share``, a
        group's ``share`` is its weight among its siblings, the groups of the same
        parent (or the top-level groups); its members have equal shares of it.
        """,
    ),
    Key(
        "when_full",
        Choice(values=WHEN_FULL),
        "what a spawn that does not fit its group's limit does",
        "refuse",
        details="""
        ``refuse`` at once with the numbers, or ``wait`` in line until capacity
        frees (the spawn page shows its position): first come, first served, or
        with ``fair_share`` whoever used less GPU time recently first.

        A group's own ``when_full`` overrides this for its members (and its
        subgroups'), so a course can refuse at once while research waits.
        A spawn over a per-user cap is always refused: only the user can free it.
        """,
    ),
    Key(
        "fair_share",
        KeyType(doc="mapping"),
        "order who waits for the same capacity by GPU time used recently",
        null_unset=True,
        details="""
        For example ``{half_life: 7d, max_wait: 30m}``. Each group's and member's
        GPU-hours are decayed with ``half_life`` (use a half-life ago counts half,
        two half-lives ago a quarter) and divided by their share (a group's
        ``share`` among its siblings; members equal within their group). With
        ``when_full: wait``, whoever has used less of their share goes first,
        arrival order breaks ties, and a server that has waited longer than
        ``max_wait`` goes first whatever its standing, so nobody waits for ever.
        ``count: billed_units`` counts each hour at its flavor's billing ``weight``
        in force then (an hour on a flavor weighted 3 weighs three of one weighted
        1, as Slurm's billing TRES does); ``gpu_hours`` (the default) counts every
        GPU-equivalent-hour alike.
        Unset (the default): the line is first come, first served.
        """,
    ),
    Key(
        "currency",
        Text(),
        "the currency of the flavors' prices, e.g. `EUR`",
        details="""
        Required once a flavor has a ``price``. A flavor's ``billing`` gives what an
        hour of one GPU-equivalent of it is billed: ``weight`` billed units (1
        unless set, so a site that bills nothing sees billed units equal to
        GPU-hours) and a ``price`` in this currency. Showback and the invoice give
        each group's GPU-hours, billed units and cost, and bill each hour at the
        rate in force then: a list of rates, each ``from`` a date, changes the
        rate for the hours after it and never the hours before.
        """,
    ),
    Key(
        "interfaces",
        KeyType(doc=_MAPPING.format("interface")),
        "what a server can open, by name",
        {},
        details="""
        For example

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
    ),
    Key(
        "datasets",
        KeyType(doc=_MAPPING.format("dataset")),
        "shared data the servers of some groups mount, by name",
        {},
        details="""
        Each is an NFS export (``nfs``, mounted inline, so it mounts in any
        namespace), an existing PersistentVolumeClaim in the server's namespace
        (``claim``; with ``namespace_per_group``, each group's own namespace) or an
        inline CSI volume (``csi``, for drivers that support ephemeral inline
        volumes, csi-driver-nfs for example; a driver that serves PersistentVolumes
        only, as most Lustre and GPFS drivers, needs a claim):

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
    ),
    Key(
        "namespace_per_group",
        Flag(),
        "put each group's servers in a namespace of its own",
        False,
        details="""
        The namespace is ``namespace_prefix`` + the group's name; the service keeps
        the group's ResourceQuota, LimitRange and NetworkPolicy there.

        A group's namespace may never be one of Kubernetes' own (``default``,
        ``kube-system``, ``kube-public``, ``kube-node-lease``, any ``kube-*``)
        nor the hub's: the hub, the service and ``jupyterhub-gpu check`` refuse
        such a policy. An existing namespace the service did not make is never
        taken over unless ``adopt_namespaces`` lists it.
        """,
    ),
    Key(
        "namespace_prefix",
        KeyType(doc="text (may be empty)"),
        "prefix of the per-group namespaces (with `namespace_per_group`)",
        "jupyterhub-gpu-",
        details="""
        Group ``research`` runs in ``jupyterhub-gpu-research``. An empty prefix makes
        the group's name its namespace's; a prefix starting with ``kube-`` is refused.
        """,
    ),
    Key(
        "adopt_namespaces",
        KeyType(doc="list of namespaces"),
        "existing namespaces the service may take over as group namespaces",
        [],
        details="""
        For example ``[jupyterhub-gpu-research]`` when a namespace was made by hand
        before ``namespace_per_group`` was turned on.

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
    ),
    Key(
        "egress",
        KeyType(doc="mapping"),
        "what servers in group namespaces may connect to (with `namespace_per_group`)",
        null_unset=True,
        details="""
        Unset (the default): not restricted, servers reach whatever the cluster's
        network lets them reach. Set, each group namespace gets a NetworkPolicy
        ``jupyterhub-gpu-egress``:

        .. code-block:: yaml

            egress:
              deny_private: true                 # default
              allow_cidrs: [198.51.100.0/24]     # e.g. a licence server
              deny_cidrs: [130.92.0.0/16]        # e.g. the site's own public range
              allow_public: true                 # default
              allow_dataset_servers: true        # default

        Always allowed: DNS (port 53 to the cluster DNS in ``kube-system`` and
        NodeLocal DNSCache's 169.254.20.10), the hub and proxy pods in the hub's
        namespace, and pods of the same group namespace. ``deny_private`` denies
        the private ranges 10.0.0.0/8, 172.16.0.0/12 and 192.168.0.0/16, the
        shared range 100.64.0.0/10, link-local 169.254.0.0/16 (the cloud
        metadata service) and IPv6's fc00::/7 and fe80::/10: storage nodes,
        databases, the nodes and internal services. ``allow_public: false``
        denies the public internet too. A dataset's NFS mount is made by the
        node, which this rule does not govern, so ``allow_dataset_servers:
        false`` is stricter and mounts still work. The cluster's network plugin
        must enforce NetworkPolicy (Calico, Cilium, ...).
        """,
    ),
    Key(
        "extra_labels",
        Labels(),
        "extra pod labels, as templates",
        {},
        check=checks.label_templates,
        details="""
        Templates with ``{username}``, ``{group}``, ``{profile}``, ``{flavor}`` and
        ``{servername}``; for example
        ``{team: "{group}", user: "{username}", job_type: notebook}``.
        """,
    ),
    Key(
        "adopted_servers_group",
        KeyType(doc="group name"),
        "the group charged for a server started before the policy, if no other is",
        details="""
        Servers started before the policy (by stock KubeSpawner, so their pods have
        none of the policy's labels) are found when the hub starts and counted from
        then on, so a group cannot be admitted its whole quota on top of them: each
        is charged to the only one of its user's groups that offers its GPU flavor
        (for a server without GPUs, the only one that offers a profile without
        GPUs); otherwise to this group; with neither, to no group (the hub log names
        it). They are never stopped or preempted because of the switch (see
        ``adopted_servers_preemptible``).
        """,
    ),
    Key(
        "adopted_servers_preemptible",
        Flag(),
        "whether new servers may preempt servers started before the policy",
        False,
        details="""
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
    ),
)
