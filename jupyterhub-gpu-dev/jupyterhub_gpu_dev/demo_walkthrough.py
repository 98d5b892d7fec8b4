"""What the demo prints once it is up: the logins, and a walkthrough of what to try
with each group (its quota, budgets, fair share, waiting line, DRA devices, JupyterLab
and VS Code), the scheduler's line and the banner around them."""

from __future__ import annotations

import importlib.util
import textwrap
from dataclasses import dataclass

from jupyterhub_gpu.core import words
from jupyterhub_gpu.core.budgets import BudgetState, format_cap, format_period
from jupyterhub_gpu.core.model import Budget, Flavor, Group, Interface, Profile
from jupyterhub_gpu.core.profiles import budget_line
from jupyterhub_gpu.core.quantities import format_duration
from jupyterhub_gpu.core.selection import base_request, offers
from jupyterhub_gpu.core.shaping import namespace_for

from . import codeserver
from .dcgm_exporter import SimulatedDCGMExporter
from .demo_objects import loopback_exports
from .demo_plan import DemoPlan
from .demo_settings import (
    DEMO_ADMIN,
    DEMO_VALUES,
    HUB_NAMESPACE,
    SCHEDULER_LOGS,
    SCHEDULER_OBJECTS,
    SCHEDULER_ROLES,
    SCRAPE_INTERVAL,
    USAGE_DATABASE,
)
from .localcluster.cluster import LocalCluster
from .localcluster.hub import LocalHub
from .localcluster.nodepools import render_nodes
from .prometheus import LocalPrometheus


def user_table(plan: DemoPlan) -> list[tuple[str, str, str]]:
    """(user, groups, what they are offered) for each demo user."""
    rows = []
    for user, groups in plan.users.items():
        slugs = [o.slug for o in offers(plan.policy, groups)]
        role = " (hub admin)" if user == DEMO_ADMIN else ""
        rows.append((user, ", ".join(groups) or "-", (", ".join(slugs) or "nothing") + role))
    return rows


@dataclass
class GPUMetrics:
    """What measures the simulated GPUs' use: the exporter and the Prometheus scraping it."""

    exporter: SimulatedDCGMExporter
    prometheus: LocalPrometheus


def _minutes(budget: Budget, gpus: float) -> str:
    """How long one server holding ``gpus`` GPU-equivalents takes to use ``budget`` up."""
    minutes = float(budget.gpu_hours) / gpus * 60
    return f"{minutes:.0f} minutes" if minutes >= 2 else f"{minutes * 60:.0f} seconds"


def _first_gpu_server(plan: DemoPlan, group: Group) -> tuple[str, str, float] | None:
    """A demo user of ``group``, the display name of the group's first GPU profile and
    its GPU-equivalents; None if the group offers no GPU profile."""
    for name in group.profiles:
        profile = plan.policy.profiles[name]
        gpus = float(base_request(plan.policy, profile).gpus)
        if gpus:
            return f"{group.name.lower()}-1", profile.display_name, gpus
    return None


def _per(seconds: int) -> str:
    """ "hour", "7 days": what a budget's window reads as after "per"."""
    window = format_period(seconds)
    return window.removeprefix("1 ")


def _when_used_up(budget: Budget) -> str:
    if budget.when_exhausted == "stop":
        return (
            f"a notice on the dashboard, and {format_duration(budget.grace)} later "
            "the server is stopped"
        )
    return "a notice on the dashboard; the server keeps running"


#: one step of the walkthrough: paragraphs, and (in a tuple) a command to run
_Step = list[str | tuple[str]]


def _group_step(plan: DemoPlan, group: Group, metrics: GPUMetrics | None) -> _Step | None:
    """What to try in ``group``: its budgets and its idle rule, with one server."""
    server = _first_gpu_server(plan, group)
    owners = [
        (owner, budget)
        for owner, budget in (
            ("the group's", group.budget),
            (f"{server[0] if server else ''}'s own", group.user_budget),
        )
        if budget is not None
    ]
    if server is None or not (owners or group.idle):
        return None
    user, profile, gpus = server
    text = f"Log in as {user}"
    if owners:
        shown = [
            budget_line(BudgetState(owner, budget, used=0.0))
            for owner, budget in (
                (group.display_name, group.budget),
                (f"{user} in {group.display_name}", group.user_budget),
            )
            if budget is not None
        ]
        text += ": the spawn form shows " + " and ".join(f'"{line}"' for line in shown)
    text += f'. Start "{profile}".'
    step: _Step = []
    if group.idle is not None:
        after = format_duration(group.idle.after)
        notice = format_duration(int(plan.service_settings.get("idle_notice", 600)))
        namespace = namespace_for(plan.policy, group.name) or HUB_NAMESPACE
        if metrics is not None:
            text += (
                " Idle reclaim: the simulated GPUs report 0% use until told otherwise, so "
                f"after {after} below {group.idle.gpu_utilization_below:g}% the dashboard "
                f"shows a notice, and {notice} later the server is stopped. Keep it busy "
                '(and {"percent": null} to idle again):'
            )
            step += [
                text,
                (
                    f"curl -X PUT {metrics.exporter.url}/utilization/{namespace}/"
                    f"""jupyter-{user} -d '{{"percent": 80}}'""",
                ),
            ]
        else:
            text += (
                f" Idle reclaim: after {after} without notebook activity the dashboard "
                f"shows a notice, and {notice} later the server is stopped."
            )
            step.append(text)
        text = "Kept busy, it" if owners else ""
    else:
        text += " It"
    for number, (owner, budget) in enumerate(owners):
        text += (
            f"{' It' if number else ''} uses {owner} {format_cap(float(budget.gpu_hours))} "
            f"GPU-hours per {_per(budget.period)} in about "
            f"{_minutes(budget, gpus)}: then {_when_used_up(budget)}."
        )
        if budget is group.budget:
            cap = format_cap(float(budget.gpu_hours))
            text += (
                f' A GPU server started then is refused with the numbers ("{group.display_name}'
                f" used ... of {cap} GPU-hours in the last {format_period(budget.period)}: "
                'GPU servers can start again at ...").'
            )
    if text:
        step.append(text)
    return step


#: the GPU-hours the built-in example's two members of a GPU group are given as history
#: (ended ``HISTORY_ENDED_AGO`` seconds before the demo starts): fair share has
#: something to weigh from the first minute
FAIR_SHARE_HISTORY = (2.0, 0.25)
#: before the shortest budget window of the built-in example (an hour): the history
#: weighs in fair share, and no budget counts it
HISTORY_ENDED_AGO = 3 * 3600


def _history_group(plan: DemoPlan) -> Group | None:
    """The group whose members get a fair-share history: with fair share on and the
    built-in example only (a site's own values are for rehearsing its own numbers), the
    first group offering GPU profiles."""
    if plan.policy.fair_share is None or plan.values_files != [DEMO_VALUES]:
        return None
    return next((g for g in plan.policy.groups.values() if _first_gpu_server(plan, g)), None)


def seed_fair_share_history(plan: DemoPlan, url: str, now: float) -> list[str]:
    """Earlier GPU time of ``<group>-1`` (more) and ``<group>-2`` (less) in the usage
    database at ``url``, as rows a day of real use would leave; what was written, in
    words (nothing without ``_history_group``)."""
    from jupyterhub_gpu.accounting.store import UsageStore
    from jupyterhub_gpu.core.budgets import UsageRecord

    group = _history_group(plan)
    if group is None:
        return []
    profile = next(o.profile for o in offers(plan.policy, [group.name]) if o.profile.gpu)
    assert profile.gpu is not None
    ended = now - HISTORY_ENDED_AGO
    records, said = [], []
    for n, hours in enumerate(FAIR_SHARE_HISTORY, 1):
        user = f"{group.name.lower()}-{n}"
        records.append(
            UsageRecord(
                uid=f"demo-history-{user}",
                key=f"demo-history/jupyter-{user}",
                user=user,
                group=group.name,
                profile=profile.name,
                flavor=profile.gpu.flavor,
                gpus=1.0,
                started=ended - hours * 3600,
                last_seen=ended,
                ended=ended,
            )
        )
        said.append(f"{user} {hours:g} GPU-hours")
    store = UsageStore(url)
    try:
        store.open(records, now=now)
    finally:
        store.dispose()
    return [f"fair share: an earlier day of {group.display_name} stood in ({', '.join(said)})"]


def _fair_share_step(plan: DemoPlan) -> _Step | None:
    group = _history_group(plan)
    if group is None or plan.policy.fair_share is None:
        return None
    heavy, light = (f"{group.name.lower()}-{n}" for n in (1, 2))
    half_life = words.duration(plan.policy.fair_share.half_life)
    text = (
        f"Fair share (half-life {half_life}): {heavy} held a GPU {FAIR_SHARE_HISTORY[0]:g} "
        f"hours a few hours ago, {light} {FAIR_SHARE_HISTORY[1]:g}. Each sees their "
        f'standing on the spawn form ("{group.display_name} fair share: you used ... x '
        'your share") and on the dashboard, where admin sees every group and member by '
        "standing. Their over-quota servers get PriorityClasses by standing, so the "
        "heaviest users' bursts are preempted first."
    )
    line = _waiting_line(plan, group)
    if line is None:
        return [text]
    profile, flavor = line
    return [
        text,
        f"The line: {group.display_name} may hold one {flavor.display_name} at a time "
        "and waits for it. "
        f"As {heavy}, start a {profile.display_name} server on it (it runs), then a named "
        "server on it too: it waits. "
        f'As {light}, start one on it: the spawn page says "position 1 of 2: you used '
        f"less GPU time recently than others waiting\". Stop {heavy}'s first server: "
        f"{light}'s starts though it asked second, and {heavy}'s waits on.",
    ]


def _waiting_line(plan: DemoPlan, group: Group) -> tuple[Profile, Flavor] | None:
    """A profile of ``group`` whose flavor the group may hold one of at a time, and that
    flavor, where the group's spawns wait when full: two members asking for it stand in
    one line (None where there is none)."""
    if plan.policy.when_full_of(group.name) != "wait":
        return None
    for name, cap in group.limit.flavors.items():
        if cap != 1:
            continue
        for profile_name in group.profiles:
            profile = plan.policy.profiles[profile_name]
            flavor_option = profile.options.get("flavor")
            choices = dict(flavor_option.choices).values() if flavor_option else ()
            if profile.gpu is not None and name in (profile.gpu.flavor, *choices):
                return profile, plan.policy.flavors[name]
    return None


def _billing_step(plan: DemoPlan, hub: LocalHub) -> list | None:
    """Chargeback: what the priced flavors cost, and where the invoice is."""
    policy = plan.policy
    if policy.currency is None:
        return None
    priced = sorted(
        ((f.billing[-1].price or 0.0, f) for f in policy.flavors.values() if f.billing),
        key=lambda pair: -pair[0],
    )
    rates = "; ".join(
        f"{f.display_name} {f.billing[-1].weight:g} billed units and {price:.2f} {policy.currency}"
        for price, f in priced
    )
    return [
        f"Chargeback: an hour of one GPU-equivalent is billed {rates}. The dashboard's "
        "showback gives each group's account, billed units and cost; as admin, its "
        f"Invoice link ({hub.service_url}invoice) prints a month's invoice, one page per "
        "account."
    ]


def walkthrough(plan: DemoPlan, hub: LocalHub, metrics: GPUMetrics | None) -> str:
    """What to try with GPU time (budgets, showback, idle reclaim), for this policy."""
    steps = [
        step
        for group in plan.policy.groups.values()
        if (step := _group_step(plan, group, metrics)) is not None
    ]
    if (lab := _lab_step(plan)) is not None:
        steps.append(lab)
    if (fair := _fair_share_step(plan)) is not None:
        steps.append(fair)
    if (dra := _dra_step(plan)) is not None:
        steps.append(dra)
    if (bill := _billing_step(plan, hub)) is not None:
        steps.append(bill)
    if not steps:
        return ""
    steps.append(
        [
            f"The dashboard ({hub.service_url}): each group's GPU use over the last day, "
            "week or month, this month's showback table (GPU-hours by group, user and "
            "flavor) with its CSV download, and the notices."
        ]
    )
    lines = ["  GPU time, what to try (budgets, showback, idle reclaim):"]
    for number, step in enumerate(steps, 1):
        for index, part in enumerate(step):
            if isinstance(part, tuple):  # a command: on one line, to copy
                lines.append(f"         {part[0]}")
                continue
            first = f"    {number}. " if index == 0 else " " * 7
            lines += textwrap.wrap(
                part,
                width=88,
                initial_indent=first,
                subsequent_indent=" " * 7,
                break_on_hyphens=False,
            )
    return "\n".join(lines) + "\n\n"


def _dra_step(plan: DemoPlan) -> _Step | None:
    """A server on DRA devices: the first group offering a profile of a dra flavor."""
    for group in plan.policy.groups.values():
        for name in group.profiles:
            profile = plan.policy.profiles[name]
            flavor = plan.policy.flavors[profile.gpu.flavor] if profile.gpu else None
            if flavor is None or flavor.kind != "dra":
                continue
            return [
                f'DRA: as {group.name.lower()}-1, start "{profile.display_name}". No node '
                f"advertises it: the spawn form counts the free {flavor.device_class} devices "
                "in the DRA node's ResourceSlices, kube-scheduler allocates one to the "
                "server's ResourceClaim, and the dashboard names it beside the server. See "
                "what the DRA driver publishes and what was allocated:",
                ("kubectl get resourceslices -o yaml; kubectl get resourceclaims -A",),
            ]
    return None


def _lab_step(plan: DemoPlan) -> _Step | None:
    """GPU time in JupyterLab (the extension), with a group whose budget stops servers."""
    if importlib.util.find_spec("jupyterhub_gpu_jupyterlab") is None:
        return None
    for group in plan.policy.groups.values():
        budget = group.budget or group.user_budget
        server = _first_gpu_server(plan, group)
        if budget is None or budget.when_exhausted != "stop" or server is None:
            continue
        user, profile, _ = server
        return [
            f'GPU time in JupyterLab: as {user}, start "{profile}" and open a notebook. '
            "The status bar shows the group, the GPU, the GPU-hours left and the next stop "
            "(click it for the details). Leave an edit unsaved: when the budget is used up "
            "a notification gives the stop time, the edit is saved before the stop, and "
            "afterwards the page says why the server stopped."
        ]
    return None


def _vscode_offer(plan: DemoPlan) -> tuple[Group, str, Interface] | None:
    """The first group offering VS Code (an interface served at /vscode/), the
    display name of the first profile it offers it with, and the interface."""
    for group in plan.policy.groups.values():
        for offer in offers(plan.policy, [group.name]):
            for interface in offer.interfaces if offer.group is group else ():
                if interface.url.rstrip("/") == "/vscode":
                    return group, offer.profile.display_name, interface
    return None


def vscode_section(plan: DemoPlan, hub: LocalHub) -> str:
    """The banner's lines on VS Code and the data its explorer shows, where the
    policy offers VS Code."""
    offer = _vscode_offer(plan)
    if offer is None:
        return ""
    group, profile, interface = offer
    name, url = interface.display_name, interface.url
    if codeserver.installed_bin_dir() is None:
        return (
            f"  {name}: code-server is not installed on this machine (the demo said why as "
            f"it started): servers opened with {name} answer 404 at {url}\n\n"
        )
    exports = loopback_exports(plan.policy)
    seen = [
        f"{d.display_name} in {d.mount_path.lstrip('/')}"
        for d in plan.policy.datasets_of(group.name)
        if d in exports or d.claim
    ]
    user = f"{group.name.lower()}-1"
    text = (
        f'{name} in the browser: as {user}, start "{profile}" with Open: {name}. The server '
        f"opens at {hub.url}/user/{user}{url}: code-server {codeserver.version()}, installed "
        "on this machine and served by jupyter-vscode-proxy (on a real cluster, the image's: "
        "images/singleuser/Dockerfile.vscode)"
        + (f"; its explorer shows {', '.join(seen)}." if seen else ".")
    )
    lines = textwrap.wrap(
        text, width=88, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False
    )
    return "\n".join(lines) + "\n\n"


def scheduler_line(plan: DemoPlan, cluster: LocalCluster) -> str:
    """The banner's lines saying which scheduler runs for real."""
    name = plan.policy.scheduler.name
    if name in plan.schedulers:
        version = cluster.state.versions.get(name, "")
        hints = [f"kubectl get {SCHEDULER_OBJECTS[name]} -A"] if name in SCHEDULER_OBJECTS else []
        log = cluster.state.path / "logs" / f"{SCHEDULER_LOGS.get(name, name)}.log"
        if log.is_file():
            hints.append(f"its log: {log}")
        return (
            f"  scheduler: {name} {version}, running for real\n"
            f"             ({SCHEDULER_ROLES[name]})\n"
            + "".join(f"             {hint}\n" for hint in hints)
        )
    if name != "default":
        return (
            f"  scheduler: kube-scheduler, standing in for {name} "
            f"(the local cluster runs no {name})\n"
        )
    return "  scheduler: kube-scheduler\n"


def banner(
    plan: DemoPlan,
    hub: LocalHub,
    cluster: LocalCluster,
    metrics: GPUMetrics | None = None,
) -> str:
    rows = user_table(plan)
    width = max(len(r[0]) for r in rows)
    group_width = max(9, *(len(r[1]) for r in rows))
    table = "\n".join(
        f"    {user:<{width}}  {groups:<{group_width}}  {sees}" for user, groups, sees in rows
    )
    values = " ".join(str(v) for v in plan.values_files)
    policy_line = f"  policy:  {values}\n"
    if plan.scheduler_option:
        policy_line = (
            f"  policy:  {values}\n"
            f"           with scheduler: {{name: {plan.scheduler_option}}} (--scheduler)\n"
        )
    logins = (
        f"  log in as (password for all: {hub.password}):\n"
        f"    {'user':<{width}}  {'groups':<{group_width}}  offered\n{table}\n\n"
    )
    if plan.auth == "values":
        authenticator = plan.hub_config["JupyterHub"]["authenticator_class"]
        logins = (
            f"  logins:  the values' authenticator ({authenticator}, --auth values); "
            "the users and their groups are its own\n\n"
        )
    elif plan.auth == "ldap":
        logins = (
            "  logins:  a local OpenLDAP directory (--auth ldap), groups read at every login\n"
            + logins
        )
    return (
        f"\nJupyterHub with the GPU policy is running at {hub.url}/hub/login\n\n"
        + logins
        + f"  usage dashboard: {hub.service_url}\n"
        + walkthrough(plan, hub, metrics)
        + vscode_section(plan, hub)
        + f"  REST API as an admin (the demo-admin service's token):\n"
        f"    export JUPYTERHUB_API_URL={hub.url}/hub/api\n"
        f"    export JUPYTERHUB_API_TOKEN={hub.api_token}\n"
        # it has the usage scope a billing job's token has: every group's numbers
        f'    curl -H "Authorization: token $JUPYTERHUB_API_TOKEN" '
        f"'{hub.service_url}api/showback?format=csv'\n\n"
        + policy_line
        + f"           (`jupyterhub-gpu profiles {values} --groups GROUP`)\n"
        + scheduler_line(plan, cluster)
        + f"  nodes:   {len(render_nodes(plan.node_pools))} simulated, {plan.node_pools_source}\n"
        f"  kubectl: export KUBECONFIG={cluster.state.kubeconfig}\n"
        f"  hub log: {hub.directory / 'jupyterhub.log'}\n"
        f"  GPU time: {cluster.state.path / USAGE_DATABASE}\n"
        + (
            f"  prometheus: {metrics.prometheus.url} (scrapes the simulated DCGM exporter "
            f"every {SCRAPE_INTERVAL:g} s)\n"
            f"  dcgm-exporter: {metrics.exporter.url}/metrics (simulated)\n"
            if metrics
            else ""
        )
        + "\nPress Ctrl-C to stop everything.\n"
    )
