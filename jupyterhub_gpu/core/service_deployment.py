"""The GPU service as a Deployment of its own (``GPUService.form: deployment``), rendered.

Pure: ``service_deployment_objects`` is what ``jupyterhub-gpu manifests`` prints beside
the RBAC for a site whose service runs outside the hub's pod, as JupyterHub's external
service (``hub.services.gpu.url`` at the Service below, no ``command``):

- a ServiceAccount of its own (its RBAC, separated from the hub's, is ``rbac_objects``'
  with ``gpu_service_account`` and ``lease``);
- a Deployment of ``replicas`` pods of the hub's image running ``jupyterhub-gpu-service``,
  with resources of its own. Each pod mounts what the hub's pod mounts to read the
  chart values (z2jh's ``hub`` ConfigMap: ``jupyterhub_config.py`` and ``z2jh.py``; the
  ``hub`` Secret's ``values.yaml`` only, none of the hub's own secrets), so the service
  reads ``hub.config.GPUPolicy`` and ``hub.config.GPUService`` exactly as the hub's
  start-up check does; its API token is the one the chart keeps for it in that Secret
  (``hub.services.gpu.apiToken``). The replicas elect a leader on a Lease named like
  the Deployment;
- a Service in front of them, which the proxy and the servers reach;
- a NetworkPolicy letting in only pods the chart lets reach the hub (the proxy, the
  servers: ``hub.jupyter.org/network-access-hub``) on the service's port, and a
  PodDisruptionBudget keeping one replica through a node drain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .objects import OWNER, OWNER_LABEL

#: the port the service listens on in its pods and its Service
PORT = 10101
#: z2jh's names: the hub's Service, ConfigMap and Secret (fullnameOverride unset)
HUB = "hub"
HUB_API_PORT = 8081
#: where z2jh mounts the hub's config in the hub container: the service looks there
CONFIG_DIR = "/usr/local/etc/jupyterhub"
#: the label z2jh's hub NetworkPolicy admits (and the chart gives the proxy and servers)
NETWORK_ACCESS_HUB = "hub.jupyter.org/network-access-hub"


@dataclass(frozen=True)
class ServiceDeployment:
    """What the Deployment is made of (the ``GPUService`` settings and the chart values)."""

    namespace: str
    image: str
    name: str = "jupyterhub-gpu-service"
    replicas: int = 2
    resources: dict[str, Any] = field(default_factory=dict)
    #: the hub's base URL (``hub.baseUrl``)
    base_url: str = "/"
    #: the service's name in ``hub.services``
    service_name: str = "gpu"
    #: its ServiceAccount (default: named like the Deployment)
    account: str = ""

    @property
    def service_account(self) -> str:
        return self.account or self.name

    @property
    def url(self) -> str:
        """What ``hub.services.gpu.url`` must be: the Service in front of the replicas."""
        return f"http://{self.name}:{PORT}"

    @property
    def labels(self) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": "jupyterhub-gpu",
            "app.kubernetes.io/component": "gpu-service",
            "app.kubernetes.io/instance": self.name,
        }


def _metadata(spec: ServiceDeployment, **extra: Any) -> dict[str, Any]:
    return {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": {**spec.labels, OWNER_LABEL: OWNER},
        **extra,
    }


def _env(spec: ServiceDeployment) -> list[dict[str, Any]]:
    base = spec.base_url if spec.base_url.endswith("/") else spec.base_url + "/"
    prefix = f"{base}services/{spec.service_name}/"
    plain = {
        "JUPYTERHUB_SERVICE_NAME": spec.service_name,
        "JUPYTERHUB_API_URL": f"http://{HUB}:{HUB_API_PORT}{base}hub/api",
        "JUPYTERHUB_BASE_URL": base,
        "JUPYTERHUB_SERVICE_PREFIX": prefix,
        "JUPYTERHUB_SERVICE_URL": spec.url,
        # what the hub gives a service it starts, for its OAuth with the hub
        "JUPYTERHUB_CLIENT_ID": f"service-{spec.service_name}",
        "JUPYTERHUB_OAUTH_CALLBACK_URL": f"{prefix}oauth_callback",
        "JUPYTERHUB_OAUTH_ACCESS_SCOPES": f'["access:services!service={spec.service_name}"]',
        "JUPYTERHUB_OAUTH_CLIENT_ALLOWED_SCOPES": "[]",
        "JUPYTERHUB_GPU_CONFIG": f"{CONFIG_DIR}/jupyterhub_config.py",
    }
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {
            "name": "JUPYTERHUB_API_TOKEN",
            "valueFrom": {
                "secretKeyRef": {
                    "name": HUB,
                    "key": f"hub.services.{spec.service_name}.apiToken",
                }
            },
        },
    ]
    return env + [{"name": k, "value": v} for k, v in plain.items()]


def _pod(spec: ServiceDeployment) -> dict[str, Any]:
    container = {
        "name": "gpu-service",
        "image": spec.image,
        "command": ["jupyterhub-gpu-service"],
        "ports": [{"name": "http", "containerPort": PORT}],
        "env": _env(spec),
        "resources": spec.resources,
        "volumeMounts": [
            {
                "name": "config",
                "mountPath": f"{CONFIG_DIR}/jupyterhub_config.py",
                "subPath": "jupyterhub_config.py",
            },
            {"name": "config", "mountPath": f"{CONFIG_DIR}/z2jh.py", "subPath": "z2jh.py"},
            {"name": "values", "mountPath": f"{CONFIG_DIR}/secret/", "readOnly": True},
        ],
        "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 5},
        "livenessProbe": {
            "tcpSocket": {"port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return {
        "metadata": {"labels": {**spec.labels, NETWORK_ACCESS_HUB: "true"}},
        "spec": {
            "serviceAccountName": spec.service_account,
            "containers": [container],
            "volumes": [
                {"name": "config", "configMap": {"name": HUB}},
                {
                    "name": "values",
                    # the chart values alone: not the hub's cookie secret, proxy token or
                    # other services' tokens the same Secret holds
                    "secret": {
                        "secretName": HUB,
                        "items": [{"key": "values.yaml", "path": "values.yaml"}],
                    },
                },
            ],
            # the replicas on different nodes, where there are several
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": spec.labels},
                            },
                        }
                    ]
                }
            },
        },
    }


def service_deployment_objects(spec: ServiceDeployment) -> list[dict[str, Any]]:
    """The ServiceAccount, Deployment, Service, NetworkPolicy and PodDisruptionBudget."""
    selector = {"matchLabels": spec.labels}
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {**_metadata(spec), "name": spec.service_account},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _metadata(spec),
            "spec": {
                "replicas": spec.replicas,
                "selector": selector,
                # a new replica is ready before an old one goes: one always answers
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
                },
                "template": _pod(spec),
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _metadata(spec),
            "spec": {
                "selector": spec.labels,
                "ports": [{"name": "http", "port": PORT, "targetPort": "http"}],
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _metadata(spec),
            "spec": {
                "podSelector": selector,
                "policyTypes": ["Ingress"],
                "ingress": [
                    {
                        "ports": [{"port": PORT}],
                        "from": [
                            {
                                "namespaceSelector": {},
                                "podSelector": {"matchLabels": {NETWORK_ACCESS_HUB: "true"}},
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _metadata(spec),
            "spec": {"minAvailable": 1 if spec.replicas > 1 else 0, "selector": selector},
        },
    ]
