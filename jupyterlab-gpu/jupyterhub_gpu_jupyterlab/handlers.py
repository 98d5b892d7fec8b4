"""The status endpoint the frontend polls, and where the GPU service is."""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Float, List, default
from traitlets import Unicode as Text
from traitlets.config import Configurable

#: where the GPU service is in a Zero to JupyterHub deployment: the hub pod's
#: service port (helm-values/base.yaml opens it to the servers)
DEFAULT_SERVICE_URL = "http://hub:10101/services/gpu/"


class GPUStatus(Configurable):
    """Settings of the GPU status (``c.GPUStatus.*`` in the server's config)."""

    service_url = Text(
        help="The GPU service's URL as this server reaches it (default: "
        "$JUPYTERHUB_GPU_SERVICE_URL, which the hub sets, else the z2jh hub's service port)"
    ).tag(config=True)

    budget_low_fraction = Float(
        0.8, help="Tell the user once when a budget is this much used (0.8: 80 %)"
    ).tag(config=True)

    runtime_warnings = List(
        Float(),
        default_value=[900.0, 120.0],
        help="Seconds before the max_runtime stop at which the user is told",
    ).tag(config=True)

    save_before = Float(
        60.0, help="Seconds before a scheduled stop at which every unsaved document is saved"
    ).tag(config=True)

    timeout = Float(5.0, help="Seconds to wait for the GPU service").tag(config=True)

    @default("service_url")
    def _default_service_url(self) -> str:
        return os.environ.get("JUPYTERHUB_GPU_SERVICE_URL") or DEFAULT_SERVICE_URL

    def to_json(self) -> dict[str, Any]:
        return {
            "budget_low_fraction": self.budget_low_fraction,
            "runtime_warnings": sorted(self.runtime_warnings, reverse=True),
            "save_before": self.save_before,
            "poll_interval": 0,
        }


class StatusHandler(APIHandler):
    """GET: this server's GPU state from the GPU service, or why it is not known."""

    def update_api_activity(self) -> None:
        # the frontend polls this: it is no sign that anyone uses the server, and
        # counting it would keep an idle server from ever being found idle
        return

    @web.authenticated
    async def get(self) -> None:
        status: GPUStatus = self.settings["jupyterhub_gpu_status"]
        user = os.environ.get("JUPYTERHUB_USER", "")
        server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        reply: dict[str, Any] = {
            "service": None,
            "error": None,
            "service_url": status.service_url,
            "settings": status.to_json(),
        }
        if not user or not token:
            reply["error"] = (
                "not running under JupyterHub (no JUPYTERHUB_USER / JUPYTERHUB_API_TOKEN)"
            )
            self.finish(json.dumps(reply))
            return
        url = url_path_join(
            status.service_url, "api/servers", quote(user, safe=""), quote(server, safe="")
        )
        request = HTTPRequest(
            url,
            headers={"Authorization": f"token {token}"},
            request_timeout=status.timeout,
            connect_timeout=status.timeout,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as e:
            reply["error"] = f"the GPU service at {status.service_url} did not answer ({e})"
            self.log.warning("jupyterhub-gpu: %s", reply["error"])
        else:
            if response.code == 200:
                reply["service"] = json.loads(response.body)
            else:
                message = ""
                try:
                    message = json.loads(response.body or b"{}").get("message", "")
                except ValueError:
                    message = (response.body or b"")[:200].decode(errors="replace")
                reply["error"] = (
                    f"the GPU service at {status.service_url} answered {response.code}"
                    + (f": {message}" if message else "")
                    + (
                        " (is access:services!service=<gpu service> in "
                        "Spawner.server_token_scopes?)"
                        if response.code == 403
                        else ""
                    )
                )
                self.log.warning("jupyterhub-gpu: %s", reply["error"])
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(reply))


def setup_handlers(web_app: Any, status: GPUStatus) -> None:
    base_url = web_app.settings["base_url"]
    web_app.settings["jupyterhub_gpu_status"] = status
    web_app.add_handlers(
        ".*$", [(url_path_join(base_url, "jupyterhub-gpu", "status"), StatusHandler)]
    )
