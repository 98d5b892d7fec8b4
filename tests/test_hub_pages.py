"""The hub's pages with each server's last stop, and where servers find the GPU service.

No hub process: the config as the hub image's ``jupyterhub_config.d`` file leaves
it, and the template variable's callable over a real sqlite usage database (the
pages themselves are rendered by a real hub in tests/test_jupyterlab_gpu.py).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

from traitlets.config import Config

from jupyterhub_gpu.accounting.events import EventStore, StopRow
from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.hub_pages import TEMPLATE_VAR, TEMPLATES, LastStops, show_last_stops
from jupyterhub_gpu.spawner import gpu_service_url

NOW = 1_790_000_000.0


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
    return SimpleNamespace(name=name, spawners=spawners)


def test_the_last_stop_of_each_server_not_running(tmp_path):
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
    shown = stops(user("ann"))
    assert [(s["server"], s["reason"]) for s in shown] == [("big", "preempted"), ("", "idle")]
    assert shown[0]["label"] == "Your server 'big'"
    assert shown[1]["label"] == "Your server"
    # a server running again: its last stop is old news
    assert [s["server"] for s in stops(user("ann", running=("big",)))] == [""]
    assert stops(None) == []


def test_a_database_out_of_reach_leaves_the_page_as_it_was_and_says_why(caplog):
    stops = LastStops(lambda: "sqlite:////nonexistent/usage.sqlite", clock=lambda: NOW)
    with caplog.at_level(logging.WARNING, "jupyterhub_gpu.hub_pages"):
        assert stops(user("ann")) == []
    assert "show no last stops" in caplog.text
    assert "nonexistent" in caplog.text


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
