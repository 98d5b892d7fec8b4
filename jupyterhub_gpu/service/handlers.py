"""The service's HTTP endpoints, all behind the hub's OAuth (``HubOAuthenticated``).

- ``/services/gpu/``: the dashboard; a browser without a session is sent to
  the hub to log in (and back).
- ``api/usage``, ``api/capacity``: JSON for a logged-in browser or a hub token
  (``Authorization: token ...``) with ``access:services!service=gpu``;
  without one, 403 with a JSON message (no redirect for API clients).
- ``metrics``: Prometheus text; needs a token with ``read:metrics`` unless
  ``GPUService.metrics_require_auth`` is false.

What a viewer sees is decided by ``views.usage_view`` alone.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web

from ..core.selection import shown
from .page import render_page
from .views import Viewer

access_log = logging.getLogger("jupyterhub_gpu.service.access")


def log_request(handler: web.RequestHandler) -> None:
    status = handler.get_status()
    level = logging.INFO if status < 400 else logging.WARNING
    if status < 300 and handler.request.path.endswith(("/metrics", "/api/usage")):
        level = logging.DEBUG  # scraped and polled often
    access_log.log(
        level,
        "%d %s %s %.1fms",
        status,
        handler.request.method,
        handler.request.uri,
        1000 * handler.request.request_time(),
    )


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    async def prepare(self) -> None:
        # identify the requester without blocking the event loop: HubAuth's sync
        # path (get_current_user) would wait for the hub on a cache miss; after
        # this, it finds the answer on the handler
        await self.hub_auth.get_user(self, sync=False)

    @property
    def service(self) -> Any:
        return self.settings["service"]

    def viewer(self) -> Viewer:
        return Viewer.from_hub_model(self.current_user)


class APIHandler(BaseHandler):
    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        self.finish(json.dumps({"status": status_code, "message": message}))

    def require_user(self) -> None:
        if self.current_user is None:
            raise web.HTTPError(
                403,
                "log in through the hub, or send a hub token with "
                "access:services!service=<this service> in the Authorization header",
            )

    def write_json(self, data: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(data))


class PageHandler(BaseHandler):
    @web.authenticated
    def get(self) -> None:
        view = self.service.view(self.viewer())
        self.set_header("Cache-Control", "no-store")
        self.finish(render_page(view))


#: the largest servers_offset / servers_limit asked of api/usage
MAX_PAGING = 1_000_000


def whole_number(name: str, value: str, maximum: int) -> int:
    """A query argument that must be a whole number from 0 to ``maximum`` (else HTTP 400)."""
    # ASCII digits only: str.isdigit() also takes "²", which int() then refuses
    if re.fullmatch(r"[0-9]{1,9}", value) and int(value) <= maximum:
        return int(value)
    raise web.HTTPError(
        400, f"{name}: expected a whole number from 0 to {maximum}, got {shown(value)}"
    )


class UsageHandler(APIHandler):
    def get(self) -> None:
        self.require_user()
        paging = {}
        for name in ("servers_offset", "servers_limit"):
            value = self.get_argument(name, None)
            if value is not None:
                paging[name] = whole_number(name, value, MAX_PAGING)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(self.service.view_json(self.viewer(), **paging))


class CapacityHandler(APIHandler):
    def get(self) -> None:
        self.require_user()
        self.write_json(self.service.view(self.viewer())["capacity"])


class MetricsHandler(APIHandler):
    @property
    def hub_scopes(self) -> set[str]:
        # the hub's own scope for reading metrics, not access to the service
        return {"read:metrics"}

    def get(self) -> None:
        if self.service.metrics_require_auth and self.current_user is None:
            raise web.HTTPError(
                403,
                "metrics need a hub token with the read:metrics scope (or set "
                "GPUService.metrics_require_auth = False)",
            )
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.service.registry))


class OAuthCallbackHandler(HubOAuthCallbackHandler):
    pass
