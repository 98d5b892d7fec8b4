"""Zero to JupyterHub values files, read the way Helm and the hub read them.

Files merge in order like ``helm -f a.yaml -f b.yaml``: mappings merge key by
key, anything else (lists included) is replaced by the later file. The policy is
then taken from ``hub.config.GPUPolicy`` through the same traitlets path the hub
uses (``c.GPUPolicy.update(...)``), so offline checks and the hub agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from traitlets import TraitError
from traitlets.config import Config

from .model import PREFIX, Policy, PolicyError
from .policy import GPUPolicy


class ValuesError(ValueError):
    pass


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        elif value is None and key in merged:
            merged.pop(key)  # helm: null deletes a key
        else:
            merged[key] = value
    return merged


def load_values(paths: list[str | Path]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for path in paths:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as e:
            raise ValuesError(f"{path}: {e.strerror}") from e
        except yaml.YAMLError as e:
            raise ValuesError(f"{path}: not valid YAML: {e}") from e
        if loaded is None:
            continue
        if not isinstance(loaded, Mapping):
            raise ValuesError(f"{path}: expected a mapping of Helm values at the top level")
        values = merge(values, loaded)
    return values


def hub_config(values: Mapping[str, Any]) -> Config:
    """The traitlets config ``hub.config`` gives the hub (z2jh applies it section by section)."""
    config = Config()
    sections = ((values.get("hub") or {}).get("config")) or {}
    if not isinstance(sections, Mapping):
        raise ValuesError("hub.config: expected a mapping of config sections")
    for section, settings in sections.items():
        if not isinstance(settings, Mapping):
            raise ValuesError(f"hub.config.{section}: expected a mapping")
        config[section].update(settings)
    return config


def check_extra_config(extra_config: Any) -> None:
    """``hub.extraConfig`` must not change this bundle's settings.

    z2jh runs ``hub.extraConfig`` last, after the hub's start-up policy check;
    and the GPU service, which cannot run the hub's config file, reads
    ``hub.config`` only. A change made there to ``c.GPUPolicy`` or
    ``c.GPUService`` would give the hub and the service two policies.
    """
    if not isinstance(extra_config, Mapping):
        return
    for key, code in sorted(extra_config.items()):
        for section in ("GPUPolicy", "GPUService"):
            if section in str(code):
                raise ValuesError(
                    f"hub.extraConfig.{key}: sets {section}, which the GPU service cannot "
                    f"see (it reads hub.config.{section}): move the setting to "
                    f"hub.config.{section}"
                )


def policy_from_config(config: Config) -> Policy:
    try:
        policy = GPUPolicy(config=config)
    except TraitError as e:
        # a section of the wrong type (e.g. groups: [a, b]); traitlets names the trait
        raise PolicyError([f"{PREFIX}: {e}"]) from e
    return policy.model


def policy_from_values(paths: list[str | Path]) -> Policy:
    values = load_values(paths)
    check_extra_config((values.get("hub") or {}).get("extraConfig"))
    return policy_from_config(hub_config(values))
