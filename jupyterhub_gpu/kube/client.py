"""The Kubernetes client: credentials from a kubeconfig or the pod's service account,
and the API server's error messages in words a person can act on."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_cluster_namespace() -> str | None:
    """The namespace of the pod we run in (the hub's), from its service account."""
    path = SERVICE_ACCOUNT / "namespace"
    return path.read_text().strip() if path.exists() else None


def _kubeconfig() -> str | None:
    """The kubeconfig to use, or None for the pod's service account."""
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    home = os.path.expanduser("~/.kube/config")
    if os.path.exists(home) and not (SERVICE_ACCOUNT / "token").exists():
        return home
    return None


async def api_client() -> client.ApiClient:
    """A client from $KUBECONFIG (or ~/.kube/config), else the pod's service account.

    A hub-managed service does not inherit the hub's environment (JupyterHub
    passes only its own variables), so ``KUBERNETES_SERVICE_HOST`` may be
    missing in the hub pod; the service account's token is enough, with the
    cluster's own DNS name for the API server.
    """
    kubeconfig = _kubeconfig()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig)
    elif (SERVICE_ACCOUNT / "token").exists():
        os.environ.setdefault("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
        os.environ.setdefault("KUBERNETES_SERVICE_PORT", "443")
        config.load_incluster_config()
    else:
        raise RuntimeError(
            "no Kubernetes credentials: set KUBECONFIG, or run in a pod with a service account"
        )
    return client.ApiClient()


def error_message(body: bytes | str | None, fallback: str) -> str:
    """The API server's own words from an error response (its Status ``message``)."""
    try:
        message = json.loads(body or b"").get("message")
    except (TypeError, ValueError, AttributeError):
        message = None
    return message or fallback


def exception_message(error: ApiException) -> str:
    """What the API server said when a call raised, e.g. a quota's exceeded message."""
    return error_message(error.body, error.reason or f"HTTP {error.status}")


class KubeAPIError(Exception):
    """The API server answered a list or watch with an error status."""

    def __init__(self, what: str, status: int, message: str) -> None:
        self.status = status
        hint = ""
        if status == 403:
            hint = (
                " (grant the service's service account list/watch on it: "
                "`jupyterhub-gpu manifests` renders the RBAC, docs/service.md lists it)"
            )
        super().__init__(f"listing {what}: {message}{hint}")
