"""The hub's pages with each server's last stop, and where servers find the GPU service.

No hub process: the config as the hub image's ``jupyterhub_config.d`` file leaves
it, and JupyterHub's own home and spawn templates with ours, rendered in Jinja's
async mode as the hub renders them, on a real event loop, over a real sqlite usage
database, locked by another connection to make it hang (the pages are rendered by
a real hub in tests/test_jupyterlab_gpu.py too).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sqlite3
import time
from types import SimpleNamespace

import pytest
from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PrefixLoader
from jupyterhub._data import DATA_FILES_PATH
from traitlets.config import Config

from jupyterhub_gpu.accounting.events import EventStore, StopRow
from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.config.service_settings import gpu_service_url
from jupyterhub_gpu.hub.pages import TEMPLATE_VAR, TEMPLATES, LastStops, show_last_stops
from kube_helpers import eventually

NOW = 1_790_000_000.0
JUPYTERHUB_TEMPLATES = os.path.join(DATA_FILES_PATH, "templates")


@functools.cache
def hub_templates() -> Environment:
    """The Jinja environment JupyterHub renders its pages with (``init_tornado_settings``):
    a site's ``template_paths`` (here ours) before its own, which ``templates/`` also names."""
    loader = ChoiceLoader(
        [
            PrefixLoader({"templates": FileSystemLoader([JUPYTERHUB_TEMPLATES])}, "/"),
            FileSystemLoader([str(TEMPLATES), JUPYTERHUB_TEMPLATES]),
        ]
    )
    return Environment(loader=loader, autoescape=True, enable_async=True)


async def render(page: str, stops: LastStops, who, server_name: str = "") -> str:
    """``page`` as the hub renders it for ``who``: its template variables called with the
    user (``template_namespace``), the page rendered asynchronously."""
    namespace = {
        "static_url": lambda *a, **k: "/hub/static/x",
        "base_url": "/hub/",
        "prefix": "/",
        "user": who,
        "for_user": who,
        "server_name": server_name,
        "url": "/hub/spawn",
        "spawner_options_form": "<p>the form</p>",
        "xsrf_token": "x",
        "parsed_scopes": set(),
        "default_server": None,
        "named_servers": [],
        "named_server_limit_per_user": 0,
        "allow_named_servers": False,
        TEMPLATE_VAR: stops(who),
    }
    return await hub_templates().get_template(page).render_async(**namespace)


def test_the_sites_own_templates_and_variables_come_first():
    c = Config()
    c.JupyterHub.template_paths = ["/site/templates"]
    c.JupyterHub.template_vars = {"org": "Physics"}
    show_last_stops(c)
    show_last_stops(c)  # twice (a config file loaded twice): added once
    assert c.JupyterHub.template_paths == ["/site/templates", str(TEMPLATES)]
    assert c.JupyterHub.template_vars["org"] == "Physics"
    assert isinstance(c.JupyterHub.template_vars[TEMPLATE_VAR], LastStops)
    bare = Config()
    show_last_stops(bare)
    assert bare.JupyterHub.template_paths == [str(TEMPLATES)]


def user(name: str, running: tuple[str, ...] = ()):
    spawners = {n: SimpleNamespace(active=True) for n in running}
    return SimpleNamespace(
        name=name,
        spawners=spawners,
        admin=False,
        spawner=SimpleNamespace(options_form="<p>the form</p>"),
        running=False,
        default_server=None,
        named_servers={},
    )


def shown_servers(html: str) -> list[str]:
    return [part.split('"', 1)[0] for part in html.split('data-server="')[1:]]


async def test_the_last_stop_of_each_server_not_running(tmp_path):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    EventStore(UsageStore(url)).write(
        [],
        [
            StopRow("ann", "", "u1", "hub", "This server was stopped through the hub", NOW - 900),
            StopRow("ann", "", "u2", "idle", "The GPU service stopped this server: idle", NOW - 60),
            StopRow("ann", "big", "u3", "preempted", "This server stopped: preempted", NOW - 30),
            StopRow("ann", "old", "u4", "budget", "budget", NOW - 8 * 86400),  # over a week
            StopRow("bob", "", "u5", "idle", "idle", NOW - 10),
        ],
        NOW,
    )
    stops = LastStops(lambda: url, clock=lambda: NOW)
    shown = await stops.fresh(user("ann"))
    assert [(s["server"], s["reason"]) for s in shown] == [("big", "preempted"), ("", "idle")]
    assert shown[0]["label"] == "Your server 'big'"
    assert shown[1]["label"] == "Your server"
    # a server running again: its last stop is old news
    assert [s["server"] for s in await stops.fresh(user("ann", running=("big",)))] == [""]
    assert stops(None) == []
    # the pages, as the hub renders them: home lists both, each server's spawn page its own
    home = await render("home.html", stops, user("ann"))
    assert shown_servers(home) == ["big", ""]
    assert "This server stopped: preempted." in home
    assert shown_servers(await render("spawn.html", stops, user("ann"), "big")) == ["big"]
    assert shown_servers(await render("spawn.html", stops, user("ann"))) == [""]
    assert shown_servers(await render("home.html", stops, user("bob"))) == [""]
    # a sync rendering (the hub's error pages) iterates what was read, reading nothing
    assert [s["server"] for s in stops(user("ann"))] == ["big", ""]
    assert list(stops(user("cid"))) == []


async def test_a_database_out_of_reach_leaves_the_page_as_it_was_and_says_why(caplog):
    stops = LastStops(lambda: "sqlite:////nonexistent/usage.sqlite", clock=lambda: NOW)
    with caplog.at_level(logging.WARNING, "jupyterhub_gpu.hub.pages"):
        assert await stops.fresh(user("ann")) == []
        assert "the form" in await render("spawn.html", stops, user("ann"))
    assert "show no last stops" in caplog.text
    assert "nonexistent" in caplog.text


def test_every_page_calls_the_variable_and_that_reads_nothing():
    """JupyterHub calls template variables for every page (the admin page, the token
    page, a 404): only a page that shows the stops reads them."""
    opened = []
    stops = LastStops(lambda: opened.append(1) or "sqlite:////nonexistent/x.sqlite")
    for name in ("ann", "bob"):
        stops(user(name))
    assert opened == []


class Heartbeat:
    """A task on the loop that wakes every 10 ms and keeps the longest gap it saw."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def __aenter__(self) -> Heartbeat:
        self._task = asyncio.create_task(self._beat())
        await asyncio.sleep(0.05)
        return self

    async def _beat(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            last = now

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()


@pytest.fixture
def usage_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    store = UsageStore(url)
    EventStore(store).write(
        [], [StopRow("ann", "", "u1", "idle", "The GPU service stopped this server", NOW - 60)], NOW
    )
    store.dispose()
    return url, tmp_path / "usage.sqlite"


async def test_a_locked_database_never_stalls_the_hubs_loop(usage_url, caplog):
    """The usage database held by another writer (a reader waits up to 10 s for it):
    pages render meanwhile without the stops, the loop never waits for the database (its
    heartbeat's worst gap, rendering included, stays well under the 0.5 s a read may
    wait, on a loaded machine too), and once the database answers the pages show the stops again."""
    url, path = usage_url
    stops = LastStops(lambda: url, clock=lambda: NOW, timeout=0.5)
    # the hub compiles its templates once, at their first page
    await render("home.html", LastStops(lambda: url), None)
    await render("spawn.html", LastStops(lambda: url), None)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("DELETE FROM jupyterhub_gpu_stops WHERE 0")
    try:
        with caplog.at_level(logging.WARNING, "jupyterhub_gpu.hub.pages"):
            async with Heartbeat() as heartbeat:
                began = time.monotonic()
                # many users' pages at once, and one user's twice
                pages = await asyncio.gather(
                    *(render("home.html", stops, user(n)) for n in ("ann", "ann", "bob", "cid")),
                    *(render("spawn.html", stops, user(f"u{i}")) for i in range(20)),
                )
                took = time.monotonic() - began
        assert heartbeat.worst < 0.3, f"the hub's loop stalled {heartbeat.worst:.3f} s"
        assert took < 2.0  # each page waited its timeout, not the database
        assert all(shown_servers(page) == [] for page in pages)
        assert "no new last stops of ann: the usage database has not answered within 0.5 s" in (
            caplog.text
        )
    finally:
        holder.execute("COMMIT")
        holder.close()

    async def shown_again() -> list[str]:
        return shown_servers(await render("home.html", stops, user("ann")))

    # the read begun while locked ends now, and serves the next page
    assert await eventually(shown_again, "the stops on the page again", within=15) == [""]


def test_servers_find_the_service_where_the_hub_runs_it():
    c = Config()
    assert gpu_service_url(c) == ""  # no service: nothing is set
    c.JupyterHub.services = [
        {"name": "other", "url": "http://elsewhere:1"},
        {"name": "gpu", "url": "http://hub:10101"},
    ]
    assert gpu_service_url(c) == "http://hub:10101/services/gpu/"
    c.JupyterHub.base_url = "/jupyter/"
    assert gpu_service_url(c) == "http://hub:10101/jupyter/services/gpu/"
    c.JupyterHub.services = [{"name": "gpu", "api_token": "x"}]  # an external one, no url
    assert gpu_service_url(c) == ""
