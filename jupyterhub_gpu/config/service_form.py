"""Where a values file runs the GPU service: in the hub's pod, or in its own Deployment.

``GPUService.form`` says which; ``hub.services.gpu`` must agree (a ``command`` for the
hub to start it in its pod, only a ``url`` at the Deployment's Service otherwise).
``check`` prints the form and what disagrees; ``manifests`` renders the Deployment's
objects from the same settings (``core.service_deployment``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from traitlets import TraitError

from ..core import words
from ..core.lease import LeaseTimings
from ..core.service_deployment import ServiceDeployment
from .service_settings import GPUService
from .values import hub_config

PREFIX = "hub.config.GPUService"


@dataclass
class ServiceForm:
    """The form a values file uses, in words, and what is wrong with it."""

    form: str
    settings: GPUService | None
    words: str = ""
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _settings(values: Mapping[str, Any]) -> tuple[GPUService | None, list[str]]:
    try:
        return GPUService(config=hub_config(values)), []
    except TraitError as e:
        return None, [f"{PREFIX}: {e}"]


def _service_entry(values: Mapping[str, Any]) -> Mapping[str, Any] | None:
    services = (values.get("hub") or {}).get("services") or {}
    entry = services.get("gpu") if isinstance(services, Mapping) else None
    return entry if isinstance(entry, Mapping) else None


def service_form(values: Mapping[str, Any], hub_namespace: str | None = None) -> ServiceForm:
    """The form of ``values``' GPU service, described, checked against ``hub.services.gpu``."""
    settings, errors = _settings(values)
    if settings is None:
        return ServiceForm("unknown", None, errors=errors)
    entry = _service_entry(values)
    report = ServiceForm(settings.form, settings)
    if settings.form == "hub-pod":
        if entry is None:
            report.words = "none (hub.services.gpu is not set)"
        elif entry.get("command"):
            report.words = "in the hub's pod (hub.services.gpu.command)"
        else:
            report.words = f"outside the hub, at {entry.get('url')} (hub.services.gpu.url)"
            report.warnings.append(
                "hub.services.gpu has no command, so the hub starts no GPU service, while "
                f"{PREFIX}.form is hub-pod: for the service's own Deployment set "
                f"{PREFIX}.form: deployment and apply what `jupyterhub-gpu manifests` renders"
            )
        return report
    timings = LeaseTimings(
        settings.lease_duration, settings.lease_renew_deadline, settings.lease_retry_period
    )
    report.errors += [f"{PREFIX}.{e}" for e in timings.errors()]
    where = f"{hub_namespace}/" if hub_namespace else ""
    url = f"http://{settings.deployment_name}:10101"
    report.words = (
        f"its own Deployment {settings.deployment_name} "
        f"({words.count(settings.replicas, 'replica')}, "
        f"leader elected on Lease {where}{settings.deployment_name}) at {url}"
    )
    if entry is None:
        report.errors.append(
            f"hub.services.gpu: not set, while {PREFIX}.form is deployment: the hub must "
            f"know the service (url: {url}, no command) to route /services/gpu/ to it"
        )
        return report
    if entry.get("command"):
        report.errors.append(
            f"hub.services.gpu.command: the hub would start the service in its pod too, "
            f"while {PREFIX}.form is deployment (its own Deployment): set command to null"
        )
    if entry.get("url") != url:
        report.warnings.append(
            f"hub.services.gpu.url is {entry.get('url')!r}: the Deployment's Service "
            f"{settings.deployment_name} answers at {url}"
        )
    accounting = ((values.get("hub") or {}).get("config") or {}).get("GPUPolicy") or {}
    url_setting = accounting.get("accounting_url") if isinstance(accounting, Mapping) else None
    if not isinstance(url_setting, str) or url_setting.startswith("sqlite"):
        report.warnings.append(
            "hub.config.GPUPolicy.accounting_url is a sqlite file, while the service runs "
            "in pods of its own: the hub and each replica would write a file of their own. "
            "Set a PostgreSQL URL they all reach (the hub's database will do)"
        )
    return report


def service_deployment(
    values: Mapping[str, Any], hub_namespace: str, settings: GPUService
) -> ServiceDeployment:
    """The Deployment's spec from the chart values: the hub's image, base URL, settings."""
    hub = values.get("hub") or {}
    image = hub.get("image") or {}
    if not image.get("name"):
        raise ValueError(
            "hub.image.name: not set; the GPU service's Deployment runs the hub's image "
            "(the chart's hub image with jupyterhub-gpu installed, images/hub/Dockerfile): "
            "set hub.image.name and hub.image.tag"
        )
    tag = image.get("tag")
    return ServiceDeployment(
        namespace=hub_namespace,
        image=f"{image['name']}:{tag}" if tag else str(image["name"]),
        name=settings.deployment_name,
        replicas=settings.replicas,
        resources=dict(settings.resources),
        base_url=str(hub.get("baseUrl") or "/"),
    )
