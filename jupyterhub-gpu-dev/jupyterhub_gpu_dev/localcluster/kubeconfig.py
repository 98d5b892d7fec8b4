"""Load a kubeconfig file into a kubernetes_asyncio Configuration."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes_asyncio import client, config


async def load_configuration(path: Path) -> client.Configuration:
    """A client configuration for the kubeconfig at ``path`` (relative paths resolved)."""
    configuration = client.Configuration()
    loader = config.kube_config.KubeConfigLoader(
        config_dict=yaml.safe_load(path.read_text()),  # noqa: ASYNC240 (a small local file)
        config_base_path=str(path.parent),
    )
    await loader.load_and_set(configuration)
    return configuration
