"""The dashboard page, rendered on the server from the view model (pure, no assets).

One self-contained HTML document: inline CSS, bars as sized ``div``s, no
scripts, no fonts or images from anywhere. It refreshes itself every 30 s.
"""

from __future__ import annotations

from html import escape
from typing import Any

from ..core.quantities import format_duration

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
"""


def _duration(seconds: int | None) -> str:
    return "" if seconds is None else format_duration(seconds)


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
    parts.append("</div>")
    return "".join(parts)


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
        rows.append(bar(flavor["display_name"], amount, f"{flavor['unit']} in use"))
        note = f"{flavor['free']} free on {flavor['nodes']} node(s)"
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
            f"<td>{escape(s['group'] or '')}</td><td>{escape(s['profile'] or '')}</td>"
            f"<td>{escape(status)}</td><td>{_duration(s['runtime_seconds'])}</td>"
            f"<td>{_duration(s['stops_in_seconds'])}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _time(iso: str | None) -> str:
    return f"{iso[:19].replace('T', ' ')} UTC" if iso else ""


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
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="refresh" content="30">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
        + "".join(body)
        + "</body></html>"
    )
