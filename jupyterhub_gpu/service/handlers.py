"""The service's HTTP endpoints, all behind the hub's OAuth (``HubOAuthenticated``).

- ``/services/gpu/``: the dashboard; a browser without a session is sent to
  the hub to log in (and back).
- ``api/usage``, ``api/capacity``: JSON for a logged-in browser or a hub token
  (``Authorization: token ...``) with ``access:services!service=gpu``;
  without one, 403 with a JSON message (no redirect for API clients).
- ``api/history?group=&from=&to=&step=``: a group's GPU-equivalents in use over
  time, by flavor; ``api/showback?month=YYYY-MM[&format=csv]``: GPU-hours of a
  month by group, user and flavor. Same authentication as ``api/usage``.
- A token with the custom scope ``custom:gpu-usage:read`` (and access to the
  service) reads ``api/usage``, ``api/history`` and ``api/showback`` as an admin
  does: every group. It counts for these JSON/CSV answers only, not for the
  dashboard page.
- ``api/invoice?month=YYYY-MM[&format=csv]`` and the page ``invoice?month=``: a
  month's GPU-hours, billed units and cost by account, group and flavor; for admins
  and a token with ``custom:gpu-usage:read`` only.
- ``metrics``: Prometheus text; needs a token with ``read:metrics`` unless
  ``GPUService.metrics_require_auth`` is false (the usage scope does not open it:
  the hub's own scope for metrics does, as for ``/hub/metrics``).

What a viewer sees is decided by ``views.usage_view`` alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from datetime import UTC, datetime
from typing import Any

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web

from ..accounting.store import AccountingUnavailable
from ..core.quantities import QuantityError, parse_duration
from ..core.selection import shown
from ..core.showback import ShowbackError, month_bounds
from .invoice_views import invoice_csv, invoice_json, invoice_page
from .page import render_page
from .readers import TooManyReads
from .server_status import may_read
from .tasks import redact_credentials
from .time_views import showback_csv
from .views import DATABASE_UNAVAILABLE, Viewer, is_policy_admin

access_log = logging.getLogger("jupyterhub_gpu.service.access")


def unavailable(error: AccountingUnavailable, viewer: Viewer) -> web.HTTPError:
    """503 with the database's own words for admins (they name its host), a plain
    sentence for everyone else."""
    text = redact_credentials(str(error)) if viewer.admin else DATABASE_UNAVAILABLE
    return web.HTTPError(503, "%s", text)


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


class Refused(web.HTTPError):
    """An HTTP error with headers of its own (tornado clears those set before an error)."""

    def __init__(self, status: int, message: str, headers: dict[str, str]) -> None:
        super().__init__(status, "%s", message)
        self.headers = headers


class APIHandler(BaseHandler):
    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        for name, value in getattr(exc, "headers", {}).items():
            self.set_header(name, value)
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

    def viewer(self) -> Viewer:
        # the API's answers are what a billing job reads: its token's usage scope counts
        return Viewer.from_hub_model(self.current_user, api=True)

    def write_json(self, data: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(data))


class PageHandler(BaseHandler):
    @web.authenticated
    async def get(self) -> None:
        view = await self.service.page_view(self.viewer(), self.get_argument("range", "day"))
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


#: the years a showback month or a history's times may be in: GPU time starts in 1970
#: (epoch seconds), and a month's end must still be a date (9999-12 ends in 10000)
FIRST_YEAR, LAST_YEAR = 1970, 9998
#: the latest time a history may reach (epoch seconds): the end of LAST_YEAR
LATEST = datetime(LAST_YEAR + 1, 1, 1, tzinfo=UTC).timestamp()


def time_argument(name: str, value: str | None, default: float) -> float:
    """A point in time: epoch seconds, or ISO 8601 (``2026-11-01T00:00:00Z``)."""
    if value is None:
        return default
    text = value.strip()
    if re.fullmatch(r"[0-9]{1,12}(\.[0-9]{1,6})?", text):
        moment = float(text)
    else:
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
            moment = (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
        except (ValueError, OverflowError):
            raise web.HTTPError(
                400, f"{name}: expected epoch seconds or an ISO 8601 time, got {shown(value)}"
            ) from None
    if not 0 <= moment < LATEST:
        raise web.HTTPError(
            400,
            f"{name}: expected a time from {FIRST_YEAR} to the end of {LAST_YEAR}, "
            f"got {shown(value)}",
        )
    return moment


def month_argument(value: str, zone: Any) -> str:
    """A showback month, ``YYYY-MM`` from ``FIRST_YEAR`` to ``LAST_YEAR`` (else HTTP 400):
    checked before anything is read, so an impossible month is the asker's mistake, not
    the service's."""
    match = re.fullmatch(r"([0-9]{4})-(0[1-9]|1[0-2])", value)
    if match is None:
        raise web.HTTPError(400, f"month: expected YYYY-MM, such as 2026-11, got {shown(value)}")
    if not FIRST_YEAR <= int(match.group(1)) <= LAST_YEAR:
        raise web.HTTPError(
            400,
            f"month: expected a month from {FIRST_YEAR}-01 to {LAST_YEAR}-12, got {shown(value)}",
        )
    try:
        month_bounds(value, zone)
    except (ValueError, OverflowError) as e:  # a time zone's rules out of its range
        raise web.HTTPError(400, f"month: {shown(value)} cannot be taken in {zone}: {e}") from None
    return value


class HistoryHandler(APIHandler):
    """GPU-equivalents in use over time for one group the viewer may see, by flavor."""

    async def get(self) -> None:
        self.require_user()
        service = self.service
        name = self.get_argument("group", "")
        group = service.visible_group(self.viewer(), name)
        if group is None:
            raise web.HTTPError(404, f"group: no group named {shown(name)} that you can see")
        # "now" to the next whole minute: the dashboard's repeated reads share an answer
        now = math.ceil(service.gpu_time.clock() / 60) * 60
        until = time_argument("to", self.get_argument("to", None), now)
        since = time_argument("from", self.get_argument("from", None), until - 86400)
        step_text = self.get_argument("step", None)
        try:
            # about 288 points, a whole number of minutes each: the same window asked
            # again a second later has the same step, and so the same answer
            step = (
                float(parse_duration(step_text))
                if step_text
                else 60.0 * max(math.ceil((until - since) / 288 / 60), 1)
            )
        except QuantityError:
            raise web.HTTPError(
                400, f"step: expected a duration such as 5m, 1h or 1d, got {shown(step_text)}"
            ) from None
        try:
            series = await service.history_reads.history(
                self.current_user["name"], group.name, since, until, step
            )
        except ShowbackError as e:
            raise web.HTTPError(400, str(e)) from None
        except TooManyReads as e:
            raise Refused(429, str(e), {"Retry-After": str(e.retry_after)}) from None
        except AccountingUnavailable as e:
            raise unavailable(e, self.viewer()) from None
        hours = service.gpu_time.snapshot.groups.get(group.name)
        self.write_json(
            {
                "group": group.name,
                # the window answered: from and to rounded out to whole steps
                "to": series.times[-1] + series.step if series.times else until,
                **series.to_json(),
                "quota_gpus": float(group.quota.gpus) if group.quota.gpus is not None else None,
                "limit_gpus": float(group.limit.gpus) if group.limit.gpus is not None else None,
                "gpu_hours": hours.to_json() if hours else None,
            }
        )


class ShowbackHandler(APIHandler):
    """GPU-hours of a month by group, user and flavor: JSON, or ``format=csv``."""

    async def get(self) -> None:
        self.require_user()
        service = self.service
        viewer = self.viewer()
        month = requested_month(self)
        output = self.get_argument("format", "json")
        if output not in ("json", "csv"):
            raise web.HTTPError(400, f"format: expected json or csv, got {shown(output)}")
        admin, groups = service.showback_scope(viewer)
        gpu_time = service.gpu_time
        # a pass replaces it: what is rendered from an answer begun before is not kept
        kept = gpu_time.rendered
        try:
            if output == "csv":
                result = await gpu_time.showback(month, groups)
            else:
                view = await gpu_time.showback_view(month, viewer, admin, groups)
        except ShowbackError as e:
            raise web.HTTPError(400, str(e)) from None
        except AccountingUnavailable as e:
            raise unavailable(e, viewer) from None
        # an admin's answer is every admin's: rendered once until the next pass
        rendered = gpu_time.rendered.get((month, output)) if admin else None
        if rendered is None:
            if output == "csv":
                # a row per user and flavor (an admin's month: thousands): off the loop,
                # as the JSON view is rendered
                rendered = await asyncio.get_running_loop().run_in_executor(
                    service.readers,
                    showback_csv,
                    month,
                    result,
                    viewer,
                    admin,
                    groups,
                    service.policy,
                    service.emissions_factor,
                )
            else:
                rendered = json.dumps(view)
            if admin:
                kept[(month, output)] = rendered
        if output == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header(
                "Content-Disposition", f'attachment; filename="gpu-showback-{month}.csv"'
            )
        else:
            self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(rendered)


def requested_month(handler: BaseHandler) -> str:
    """The billing month a request asks for (``month``), else this one."""
    gpu_time = handler.service.gpu_time
    month = handler.get_argument("month", None)
    if month is None:
        return gpu_time.month_of(gpu_time.clock())
    return month_argument(month, gpu_time.zone)


async def month_showback(handler: BaseHandler, groups: set[str] | None) -> tuple[str, Any]:
    """The month a request asks for and its showback of ``groups`` (None: all), or the
    HTTP error that says what went wrong."""
    month = requested_month(handler)
    try:
        return month, await handler.service.gpu_time.showback(month, groups)
    except ShowbackError as e:
        raise web.HTTPError(400, str(e)) from None
    except AccountingUnavailable as e:
        raise unavailable(e, handler.viewer()) from None


def require_invoice_reader(handler: BaseHandler) -> None:
    """Invoices are every account's: for admins (and a token with the usage scope)."""
    if not is_policy_admin(handler.service.policy, handler.viewer()):
        raise web.HTTPError(
            403,
            "invoices are for admins: log in as a hub or policy admin, or send a token "
            "with the custom:gpu-usage:read scope",
        )


class InvoiceHandler(APIHandler):
    """A month's GPU-hours, billed units and cost by account, group and flavor: JSON, or
    ``format=csv``."""

    async def get(self) -> None:
        self.require_user()
        output = self.get_argument("format", "json")
        if output not in ("json", "csv"):
            raise web.HTTPError(400, f"format: expected json or csv, got {shown(output)}")
        require_invoice_reader(self)
        month, result = await month_showback(self, None)
        service = self.service
        self.set_header("Cache-Control", "no-store")
        if output == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header(
                "Content-Disposition", f'attachment; filename="gpu-invoice-{month}.csv"'
            )
            self.finish(invoice_csv(month, result, service.policy))
        else:
            zone = service.gpu_time.months.billing_timezone
            self.write_json(invoice_json(month, zone, result, service.policy))


class InvoicePageHandler(BaseHandler):
    """The month's invoice as a printable page (one page per account)."""

    @web.authenticated
    async def get(self) -> None:
        require_invoice_reader(self)
        month, result = await month_showback(self, None)
        zone = self.service.gpu_time.months.billing_timezone
        self.set_header("Cache-Control", "no-store")
        self.finish(invoice_page(month, zone, result, self.service.policy))


class ServerStatusHandler(APIHandler):
    """One server's GPU time, for its own JupyterLab (``server_status``): readable with
    that server's token, the user's own token, or an admin's ``access:servers``."""

    def get(self, user: str, name: str = "") -> None:
        self.require_user()
        scopes = self.current_user.get("scopes") or ()
        if not may_read(scopes, user, name):
            raise web.HTTPError(
                403,
                f"this token may not read the server {shown(user + '/' + name)}: a server's "
                "token (JUPYTERHUB_API_TOKEN) reads its own server only",
            )
        self.write_json(self.service.server_status(user, name))


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
