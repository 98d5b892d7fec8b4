"""GPU time where users work: a JupyterLab 4 extension and its server extension.

The server extension answers ``<base_url>jupyterhub-gpu/status`` for the
frontend: it asks the hub's GPU service about this server alone
(``api/servers/<user>/<server name>``) with this server's own token
(``JUPYTERHUB_API_TOKEN``), and adds the settings of the notifications and of
saving before a stop. It needs nothing of the hub's: no Kubernetes client, no
KubeSpawner, no jupyterhub-gpu.
"""

from __future__ import annotations

from typing import Any

from .handlers import GPUStatus, setup_handlers

__version__ = "0.1.0"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyterhub-gpu-jupyterlab"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyterhub_gpu_jupyterlab"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    settings = GPUStatus(parent=server_app)
    setup_handlers(server_app.web_app, settings)
    server_app.log.info("jupyterhub-gpu-jupyterlab: GPU status from %s", settings.service_url)


__all__ = ["GPUStatus", "__version__"]
