"""The dashboard page, rendered on the server from the view model (pure, no assets).

One self-contained HTML document: inline CSS, bars as sized ``div``s, charts
as inline SVG, no fonts or images from anywhere. Its one inline script says every
moment on the page (written ``2026-12-01 14:05 UTC``, as ``core.words.moment``
writes them, in notices too) in the reader's time zone, the same way the
JupyterLab extension does; without it they stay in UTC. It refreshes itself every
30 s.
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from typing import Any

from ..core import words
from .fair_share import fair_share_section
from .showback_page import showback_section

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem;color:#1d2430;
background:#f6f7f9}
h1{font-size:1.5rem;margin:0 0 .2rem}h2{font-size:1.15rem;margin:1.6rem 0 .6rem}
.who{color:#5b6575;margin-bottom:1rem}.badge{background:#2d6cdf;color:#fff;border-radius:4px;
padding:0 .4rem;font-size:.8rem;margin-left:.4rem}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(22rem,1fr));gap:1rem}
.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:1rem}
.card h3{margin:0 0 .6rem;font-size:1.05rem}
.row{margin:.45rem 0}.label{display:flex;justify-content:space-between;font-size:.9rem}
.bar{position:relative;height:14px;background:#e8ebf0;border-radius:7px;overflow:hidden;
margin-top:.2rem}
.fill{position:absolute;left:0;top:0;bottom:0;background:#3b82f6}
.fill.over{background:#f59e0b}.fill.full{background:#dc2626}
.quota{position:absolute;top:0;bottom:0;width:2px;background:#111827}
.muted{color:#6b7280;font-size:.85rem}.warn{color:#b45309}.err{color:#b91c1c}
table{border-collapse:collapse;background:#fff;width:100%;font-size:.9rem}
th,td{border-bottom:1px solid #e5e7eb;padding:.35rem .6rem;text-align:left}
.notice{background:#fff7ed;border:1px solid #fdba74;border-radius:6px;padding:.4rem .6rem;
margin:.3rem 0;font-size:.9rem}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(30rem,1fr));gap:1rem}
.chart svg{width:100%;height:auto;display:block}.legend{font-size:.8rem;color:#374151}
.legend span{margin-right:.8rem;white-space:nowrap}.key{display:inline-block;width:.8rem;
height:.8rem;border-radius:2px;margin-right:.25rem;vertical-align:-1px}
.ranges a{margin-right:.6rem}.ranges b{margin-right:.6rem}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.datasets{margin:.6rem 0 0;padding:0;list-style:none;font-size:.85rem}
.datasets li{margin:.2rem 0}.datasets code{font-size:.8rem}
"""

#: stacked flavors' colours, in order; the lines' colours
_PALETTE = ("#3b82f6", "#10b981", "#8b5cf6", "#f59e0b", "#ec4899", "#14b8a6", "#64748b")
_LINES = {"quota": "#111827", "limit": "#dc2626", "budget": "#16a34a"}
RANGES = {"day": 86400, "week": 7 * 86400, "month": 30 * 86400}


def _duration(seconds: int | None) -> str:
    return "" if seconds is None else words.duration(seconds)


#: ``localMoments(text)``: every ``YYYY-MM-DD HH:MM UTC`` in ``text`` in the browser's
#: time zone, in the same format (``2026-12-01 15:05 CET``); what the JupyterLab
#: extension's ``localTimes`` does (``jupyterlab-gpu/src/words.ts``: tested together)
LOCAL_MOMENTS_JS = r"""
function localMoments(text) {
  function two(n) { return (n < 10 ? "0" : "") + n; }
  return text.replace(/(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}) UTC/g,
    function (found, y, mo, d, h, mi) {
      var t = new Date(Date.UTC(+y, +mo - 1, +d, +h, +mi));
      var zone = "";
      try {
        new Intl.DateTimeFormat("en-US", {timeZoneName: "short"}).formatToParts(t)
          .forEach(function (part) { if (part.type === "timeZoneName") zone = part.value; });
      } catch (e) { return found; }
      if (!zone) return found;
      return t.getFullYear() + "-" + two(t.getMonth() + 1) + "-" + two(t.getDate()) + " " +
        two(t.getHours()) + ":" + two(t.getMinutes()) + " " + zone;
    });
}
"""

#: the page's script: every moment in its text, in the reader's time zone
_SCRIPT = (
    "<script>"
    + LOCAL_MOMENTS_JS
    + """(function () {
  var walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT), node;
  while ((node = walk.nextNode())) {
    var local = localMoments(node.nodeValue);
    if (local !== node.nodeValue) node.nodeValue = local;
  }
})();
</script>"""
)


def bar(title: str, amount: dict[str, Any], unit: str) -> str:
    """One labelled bar: used against limit, with a mark at the quota; no cap, no bar."""
    used, quota, limit = amount["used"], amount["quota"], amount["limit"]
    scale = limit if limit else quota if quota else None
    text = f"{amount['text']} {unit}".strip()
    parts = [
        f'<div class="row"><div class="label"><span>{escape(title)}</span>'
        f"<span>{escape(text)}</span></div>"
    ]
    if scale:
        width = min(used / scale * 100, 100)
        state = "full" if used >= scale else "over" if quota is not None and used > quota else ""
        parts.append('<div class="bar">')
        parts.append(f'<div class="fill {state}" style="width:{width:.1f}%"></div>')
        if quota is not None and limit and quota < limit:
            parts.append(
                f'<div class="quota" style="left:{quota / scale * 100:.1f}%" title="quota"></div>'
            )
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


def group_card(group: dict[str, Any]) -> str:
    title = escape(group["display_name"])
    parts = [f'<div class="card" data-group="{escape(group["name"])}"><h3>{title}</h3>']
    if group["unlimited"]:
        parts.append('<div class="muted">unlimited</div>')
    elif group["gpus"]["limit"] is None:
        parts.append('<div class="muted">no GPU limit</div>')
    parts.append(bar("GPUs", group["gpus"], "GPUs"))
    for flavor in group["flavors"]:
        parts.append(bar(flavor["display_name"], flavor, "in use"))
    parts.append(bar("CPU", group["cpu"], "CPU"))
    parts.append(bar("Memory", group["memory"], ""))
    servers = group["servers"]
    parts.append(
        bar(
            "Servers",
            servers,
            "server" if servers["used"] == 1 and not servers["limit"] else "servers",
        )
    )
    if group["gpus"]["quota"] is not None and group["gpus"]["limit"] != group["gpus"]["quota"]:
        parts.append(
            f'<div class="muted">quota {group["gpus"]["quota"]} GPUs guaranteed; '
            "above it servers may be preempted</div>"
        )
    if group["max_runtime_seconds"]:
        parts.append(
            f'<div class="muted">servers stop after {_duration(group["max_runtime_seconds"])}</div>'
        )
    if group["waiting"]:
        parts.append(f'<div class="warn">{group["waiting"]} waiting for room</div>')
    if group["over_limit"]:
        parts.append(f'<div class="err">{escape(group["over_limit"])}</div>')
    parts.append(datasets_list(group.get("datasets") or []))
    parts.append("</div>")
    return "".join(parts)


def datasets_list(datasets: list[dict[str, Any]]) -> str:
    """A group's datasets: what each is, where it is mounted, and a claim that is missing."""
    if not datasets:
        return ""
    items = []
    for dataset in datasets:
        access = "read-only" if dataset["read_only"] else "read-write"
        line = (
            f"<b>{escape(dataset['display_name'])}</b> at <code>{escape(dataset['mount_path'])}"
            f"</code> ({access})"
        )
        if dataset["description"]:
            line += f' <span class="muted">{escape(dataset["description"])}</span>'
        css = {"missing": "err", "unknown": "warn"}.get(dataset["status"], "")
        if dataset["problem"]:
            line += f'<div class="{css}">{escape(dataset["problem"])}</div>'
        items.append(
            f'<li data-dataset="{escape(dataset["name"])}" data-status="{dataset["status"]}">'
            f"{line}</li>"
        )
    return f'<div class="muted">Datasets</div><ul class="datasets">{"".join(items)}</ul>'


def capacity_section(capacity: dict[str, Any]) -> str:
    if not capacity["known"]:
        return (
            '<p class="muted">Cluster capacity unknown: the service cannot read nodes and '
            "pods cluster-wide (see the service's health below, and docs/service.md for the "
            "RBAC it needs).</p>"
        )
    if not capacity["flavors"]:
        return '<p class="muted">The policy defines no GPU flavors.</p>'
    rows = []
    for flavor in capacity["flavors"]:
        if flavor["allocatable"] is None:
            rows.append(
                f'<div class="row"><div class="label"><span>'
                f"{escape(flavor['display_name'])}</span><span>unknown</span></div>"
                f'<div class="muted">{escape(flavor["note"])}</div></div>'
            )
            continue
        amount = {
            "used": flavor["allocated"],
            "quota": None,
            "limit": flavor["allocatable"],
            "text": f"{flavor['allocated']} of {flavor['allocatable']}",
        }
        unit = words.noun(
            str(flavor["allocatable"]), flavor["unit"].removesuffix("s"), flavor["unit"]
        )
        rows.append(bar(flavor["display_name"], amount, f"{unit} in use"))
        note = f"{flavor['free']} free on {words.count(flavor['nodes'], 'node')}"
        if flavor["note"]:
            note += f"; {flavor['note']}"
        rows.append(f'<div class="muted">{escape(note)}</div>')
    return f'<div class="card">{"".join(rows)}</div>'


def servers_section(servers: list[dict[str, Any]], admin: bool) -> str:
    if not servers:
        return '<p class="muted">No servers running.</p>'
    head = (
        "<tr>"
        + ("<th>User</th>" if admin else "")
        + (
            "<th>Server</th><th>Group</th><th>Profile</th><th>Status</th><th>Running for</th>"
            "<th>Stops in</th></tr>"
        )
    )
    rows = []
    for s in servers:
        if s["queue_position"]:
            status = f"waiting: position {s['queue_position']}"
        elif s["pending"]:
            status = {"spawn": "starting", "stop": "stopping"}.get(s["pending"], s["pending"])
        else:
            status = "ready" if s["ready"] else "not ready"
        rows.append(
            "<tr>"
            + (f"<td>{escape(s['user'])}</td>" if admin else "")
            + f"<td>{escape(s['name'] or '(default)')}</td>"
            f"<td>{escape(s['group'] or '')}</td><td>{escape(s['profile'] or '')}"
            + (" (started before the GPU policy)" if s.get("before_policy") else "")
            + "".join(
                f'<br><span class="muted device">{escape(d)}</span>' for d in s.get("devices", ())
            )
            + "</td>"
            f"<td>{escape(status)}</td><td>{_duration(s['runtime_seconds'])}</td>"
            f"<td>{_duration(s['stops_in_seconds'])}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _time(iso: str | None) -> str:
    if not iso:
        return ""
    return words.moment(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())


def tasks_section(tasks: list[dict[str, Any]]) -> str:
    rows = []
    for t in tasks:
        state = "ok" if t["ok"] else "failing" if t["consecutive_failures"] else "starting"
        if t["consecutive_failures"]:
            state += f" ({t['consecutive_failures']} in a row, retrying with backoff)"
        css = "" if t["ok"] else "err"
        error = f"{_time(t['last_error_at'])}: {t['last_error']}" if t["last_error"] else ""
        rows.append(
            f'<tr><td>{escape(t["name"])}</td><td class="{css}">{escape(state)}</td>'
            f"<td>{escape(_time(t['last_success']) or 'never')}</td>"
            f'<td class="err">{escape(error)}</td>'
            f"<td>{escape(t['last_result'] or '')}</td></tr>"
        )
    return (
        "<table><tr><th>Task</th><th>State</th><th>Last success</th><th>Last error</th>"
        f"<th>Last result</th></tr>{''.join(rows)}</table>"
    )


def lease_section(lease: dict[str, Any], waiting: int) -> str:
    """The replicas' Lease: who acts, since when, its timings, this replica's part."""
    holder = lease["holder"] or "nobody"
    me = "acts" if lease["acting"] else "stands by (answers the dashboard and the API)"
    rows = [
        ("Lease", lease["lease"]),
        ("Acting replica", holder),
        ("Held since", _epoch(lease["acquired"]) if lease["holder"] else ""),
        ("Last renewed", _epoch(lease["renewed"])),
        ("Changes of holder", str(lease["transitions"])),
        (
            "Timings",
            f"lease {_setting(lease['duration_seconds'])}, renew deadline "
            f"{_setting(lease['renew_deadline_seconds'])}, "
            f"retry {_setting(lease['retry_period_seconds'])}",
        ),
        ("This replica", f"{lease['identity']}: {me}"),
    ]
    if lease.get("error"):
        rows.append(("Last error", lease["error"]))
    if waiting:
        rows.append(("Stops waiting for the hub", str(waiting)))
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _setting(seconds: float) -> str:
    """A timing setting in words: ``15 seconds``, ``1 minute 30 seconds``; a fraction of
    a second as set (``0.4 seconds``), where whole seconds would hide it."""
    if float(seconds).is_integer():
        return words.duration(seconds)
    return words.count(seconds, "second")


def orphans_section(orphans: list[dict[str, Any]]) -> str:
    """Server pods no hub server owns: still charged; deleted at the time shown."""
    rows = [
        f"<tr><td>{escape(o['pod'])}</td><td>{escape(o['user'])}</td>"
        f"<td>{escape(o['server'] or '(default)')}</td><td>{escape(o['group'])}</td>"
        f"<td>{escape(_time(o['since']))}</td>"
        f"<td>{escape(_time(o['deletes_at']) or 'only reported')}</td></tr>"
        for o in orphans
    ]
    return (
        "<table><tr><th>Pod</th><th>User</th><th>Server</th><th>Charged to</th>"
        f"<th>No hub server since</th><th>Deleted at</th></tr>{''.join(rows)}</table>"
    )


def foreign_section(pods: list[dict[str, Any]]) -> str:
    """Pods labelled as servers they cannot be: what they claim, and why not."""
    rows = [
        f"<tr><td>{escape(p['pod'])}</td><td>{escape(p['user'] or '')}</td>"
        f"<td>{escape(p['server'] or '(default)')}</td><td>{escape(p['group'] or '')}</td>"
        f"<td>{escape(p['why'] or '')}</td></tr>"
        for p in pods
    ]
    return (
        "<p>Counted for no group and never taken for a server's pod: delete those "
        "nobody knows.</p><table><tr><th>Pod</th><th>Says it is the server of</th>"
        f"<th>Server</th><th>Labelled for</th><th>Why not</th></tr>{''.join(rows)}</table>"
    )


def _epoch(epoch: float | None) -> str:
    return words.moment(epoch) if epoch else "never"


def _short_time(epoch: float, span: float) -> str:
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%H:%M" if span <= 86400 else "%b %d")


def chart_svg(chart: dict[str, Any], width: int = 560, height: int = 170) -> str:
    """A group's GPU-equivalents in use over time, stacked by flavor, with its quota,
    limit and the sustained use its budget allows as dashed lines (inline SVG)."""
    times, flavors = chart["times"], chart["flavors"]
    left, right, top, bottom = 44, 8, 8, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    stacked = [sum(values[i] for values in flavors.values()) for i in range(len(times))]
    lines = {k: chart.get(k) for k in ("quota", "limit", "budget") if chart.get(k)}
    if lines.get("limit") == lines.get("quota"):
        lines.pop("limit", None)  # one line, not two drawn on top of each other
    peak = max([*stacked, *lines.values(), 1e-9])
    scale = peak * 1.1
    count = max(len(times), 1)

    def x(i: float) -> float:
        return left + plot_w * i / count

    def y(value: float) -> float:
        return top + plot_h * (1 - value / scale)

    parts = [
        f'<svg viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(chart["title"])}" xmlns="http://www.w3.org/2000/svg">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#f9fafb" '
        'stroke="#e5e7eb"/>',
    ]
    base = [0.0] * len(times)
    for n, (flavor, values) in enumerate(flavors.items()):
        tops = [b + v for b, v in zip(base, values, strict=True)]
        upper = " ".join(
            f"{x(i):.1f},{y(t):.1f} {x(i + 1):.1f},{y(t):.1f}" for i, t in enumerate(tops)
        )
        lower = " ".join(
            f"{x(i + 1):.1f},{y(b):.1f} {x(i):.1f},{y(b):.1f}"
            for i, b in reversed(list(enumerate(base)))
        )
        colour = _PALETTE[n % len(_PALETTE)]
        parts.append(
            f'<polygon points="{upper} {lower}" fill="{colour}" fill-opacity=".75" '
            f'stroke="{colour}" stroke-width=".5"><title>{escape(flavor)}</title></polygon>'
        )
        base = tops
    for name, value in lines.items():
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'stroke="{_LINES[name]}" stroke-width="1.5" stroke-dasharray="5 3">'
            f"<title>{name}: {value:.3g} GPUs</title></line>"
        )
    for value in (0.0, scale / 2, scale):
        parts.append(
            f'<text x="{left - 4}" y="{y(value) + 4:.1f}" font-size="10" text-anchor="end" '
            f'fill="#6b7280">{value:.2g}</text>'
        )
    if times:
        span = times[-1] - times[0] + chart["step"]
        for i, anchor in ((0, "start"), (len(times) // 2, "middle"), (len(times), "end")):
            moment = times[0] + i * chart["step"]
            parts.append(
                f'<text x="{x(i):.1f}" y="{height - 6}" font-size="10" text-anchor="{anchor}" '
                f'fill="#6b7280">{_short_time(moment, span)}</text>'
            )
    parts.append("</svg>")
    legend = [
        f'<span><i class="key" style="background:{_PALETTE[n % len(_PALETTE)]}"></i>'
        f"{escape(f)}</span>"
        for n, f in enumerate(flavors)
    ]
    described = {
        "quota": "quota",
        "limit": "limit",
        "budget": "budget (sustained GPUs it allows)",
    }
    legend += [
        f'<span><i class="key" style="background:{_LINES[k]}"></i>{described[k]} {v:.3g}</span>'
        for k, v in lines.items()
    ]
    return "".join(parts) + f'<div class="legend">{"".join(legend)}</div>'


def gpu_time_section(view: dict[str, Any]) -> str:
    """The charts of the chosen range, each group's GPU-hours, and this month's showback."""
    gpu_hours = view["gpu_hours"]
    parts = []
    accounting = gpu_hours["accounting"]
    if accounting["ok"] is False:
        then = (
            "GPU spawns of groups with a budget are admitted unchecked"
            if accounting["when_unavailable"] == "admit"
            else "GPU spawns of groups with a budget are refused until it is back"
        )
        parts.append(
            f'<p class="err">GPU-hour accounting unavailable ({escape(accounting["error"] or "")})'
            f": {then}.</p>"
        )
    if accounting.get("behind"):
        age = accounting.get("oldest_unwritten_age_seconds") or 0
        unwritten = accounting["unwritten"]
        behind = (
            f"GPU-hour accounting is behind: the usage of {words.count(unwritten, 'server')} "
            f"is not written yet, the oldest from {words.duration(age)} ago; last written "
            f"{_epoch(accounting.get('last_write'))}; GPU-hours shown as of "
            f"{_epoch(accounting.get('numbers_from'))}"
        )
        if accounting.get("dropped"):
            behind += (
                f"; {words.count(accounting['dropped'], 'event')} dropped because too many "
                "were kept: see the service's log"
            )
        parts.append(f'<p class="err">{escape(behind)}.</p>')
    current = view.get("range", "day")
    links = [
        f"<b>{name}</b>" if name == current else f'<a href="?range={name}">{name}</a>'
        for name in RANGES
    ]
    parts.append(f'<div class="ranges">Last {"".join(links)}</div>')
    charts = view.get("charts") or []
    cards = []
    for chart in charts:
        hours = gpu_hours["groups"].get(chart["group"])
        note = ""
        if hours:
            window = words.period(hours["period_seconds"])
            if hours["budget"] is not None:
                used, budget = words.numbers([hours["used"], hours["budget"]], grouped=True)
                unit = hours.get("unit", words.GPU_HOURS)  # billed units: a budget in units
                note = f"{used} of {budget} {unit} used in the last {window}"
                if hours["exhausted"]:
                    note += ": used up"
            else:
                note = f"{words.gpu_hours(hours['used'])} used in the last {window}"
        cards.append(
            f'<div class="card chart" data-chart="{escape(chart["group"])}">'
            f"<h3>{escape(chart['title'])}</h3>{chart_svg(chart)}"
            f'<div class="muted">{escape(note)}</div></div>'
        )
    if cards:
        parts.append(f'<div class="charts">{"".join(cards)}</div>')
    else:
        parts.append('<p class="muted">No GPU use to show.</p>')
    if view.get("charts_busy"):
        parts.append(
            '<p class="muted">Some charts are not drawn: too many GPU-use computations are '
            "under way at once; they come with the page's next refresh.</p>"
        )
    if view.get("charts_hidden"):
        parts.append(
            f'<p class="muted">and {view["charts_hidden"]} more groups: '
            "api/history?group=NAME gives any of them</p>"
        )
    parts.append(showback_section(view.get("showback"), view.get("admin", False)))
    return "".join(parts)


def render_page(view: dict[str, Any], title: str = "GPU usage") -> str:
    badge = '<span class="badge">admin: all groups</span>' if view["admin"] else ""
    notices = "".join(
        f'<div class="notice">{escape(_time(n["at"]))}: {escape(n["text"])}</div>'
        for n in view["notices"][-20:][::-1]
    )
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<div class="who">Signed in as {escape(view["user"])}{badge}</div>',
        notices,
        "<h2>Groups</h2>",
        '<div class="cards">' + "".join(group_card(g) for g in view["groups"]) + "</div>",
        "<h2>GPU use over time</h2>",
        gpu_time_section(view),
        fair_share_section(view.get("fair_share")),
        "<h2>Cluster capacity</h2>",
        capacity_section(view["capacity"]),
        "<h2>" + ("All servers" if view["admin"] else "My servers") + "</h2>",
        servers_section(view["servers"], view["admin"]),
    ]
    hidden = view["servers_total"] - len(view["servers"])
    if hidden > 0:
        body.append(
            f'<p class="muted">and {hidden} more: api/usage?servers_offset='
            f"{len(view['servers'])} lists them</p>"
        )
    if view["admin"] and view["tasks"]:
        body += ["<h2>Service health</h2>", tasks_section(view["tasks"])]
        if view.get("lease"):
            body += [
                "<h2>Service replicas</h2>",
                lease_section(view["lease"], view.get("stops_waiting_for_hub", 0)),
            ]
        if view.get("orphans"):
            body += ["<h2>Server pods the hub does not own</h2>", orphans_section(view["orphans"])]
        if view.get("foreign_pods"):
            body += ["<h2>Foreign pods</h2>", foreign_section(view["foreign_pods"])]
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="refresh" content="30">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
        + "".join(body)
        + _SCRIPT
        + "</body></html>"
    )
