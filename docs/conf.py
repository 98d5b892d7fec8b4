"""Sphinx configuration of the jupyterhub-gpu documentation (MyST Markdown).

Built by scripts/test with warnings as errors:

    python3 -m sphinx -W --keep-going -b html docs docs/_build/html

The configuration reference is generated from the code: the traits of
``GPUPolicy``, ``GPUKubeSpawner``, ``GPUService`` and ``LDAPGroupsAuthenticator``
(autodoc-traits) and the keys the policy accepts (the allow-lists in
``jupyterhub_gpu.core.model``), written to
``docs/_generated/`` at build time.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

project = "jupyterhub-gpu"
copyright = "jupyterhub-gpu contributors"
extensions = ["myst_parser", "autodoc_traits", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
html_theme = "alabaster"
html_theme_options = {"page_width": "1200px", "sidebar_width": "240px"}
html_title = "jupyterhub-gpu"
autodoc_member_order = "bysource"
# the docs build offline: no intersphinx inventories are fetched


def _own_traits(cls, base) -> str:
    """autotrait entries for the config traits ``cls`` adds to ``base``'s."""
    own = [
        name
        for name in cls.class_own_traits(config=True)
        if name not in base.class_traits(config=True)
    ]
    lines = ["```{eval-rst}", f".. currentmodule:: {cls.__module__}", ""]
    for name in sorted(own):
        lines += [f".. autotrait:: {cls.__name__}.{name}", ""]
    lines.append("```")
    return "\n".join(lines) + "\n"


def _spawner_traits() -> str:
    from kubespawner import KubeSpawner

    from jupyterhub_gpu.hub.spawner import GPUKubeSpawner

    return _own_traits(GPUKubeSpawner, KubeSpawner)


def _service_traits() -> str:
    from traitlets.config import Configurable

    from jupyterhub_gpu.config.service_settings import GPUService

    return _own_traits(GPUService, Configurable)


def _ldap_traits() -> str:
    from ldapauthenticator import LDAPAuthenticator

    from jupyterhub_gpu.auth.ldap import LDAPGroupsAuthenticator

    return _own_traits(LDAPGroupsAuthenticator, LDAPAuthenticator)


def _policy_keys() -> str:
    """Tables of the keys the policy accepts, from the parser's own allow-lists."""
    from jupyterhub_gpu.core import model

    def keys(names) -> str:
        return ", ".join(f"`{n}`" for n in sorted(names))

    rows = ["| where | keys |", "|---|---|"]
    for kind in model.KINDS:
        allowed = model._FLAVOR_COMMON | model._FLAVOR_KEYS[kind]
        rows.append(f"| `flavors.<name>` with `kind: {kind}` | {keys(allowed)} |")
    rows.append(f"| `profiles.<name>` | {keys(model._PROFILE_KEYS)} |")
    rows.append("| `profiles.<name>.gpu` | `count`, `flavor` |")
    rows.append(
        "| `profiles.<name>.options` | `flavor`, `gpus`, `image` "
        "(each: `choices`, `display_name`) |"
    )
    rows.append("| `interfaces.<name>` | `display_name`, `url` |")
    rows.append(f"| `datasets.<name>` | {keys(model._DATASET_KEYS)} |")
    rows.append("| `datasets.<name>.nfs` | `path`, `server` |")
    rows.append("| `datasets.<name>.csi` | `driver`, `fs_type`, `volume_attributes` |")
    rows.append(f"| `groups.<name>` | {keys(model._GROUP_KEYS)} |")
    rows.append("| `everyone` | " + keys(model._GROUP_KEYS - model._EVERYONE_EXCLUDES) + " |")
    rows.append("| `quota`, `limit`, `per_user` | `cpu`, `flavors`, `gpus`, `memory`, `servers` |")
    rows.append(
        "| `scheduler` | `in_quota_priority_class`, `name` "
        f"({', '.join(model.SCHEDULERS)}), `over_quota_priority_class` |"
    )
    rows.append(
        "| `profiles.<name>.kubespawner_override` | anything but "
        + keys(model.ACCOUNTED_OVERRIDES)
        + " |"
    )
    return "\n".join(rows) + "\n"


def _node_pools(example: str) -> str:
    """What ``jupyterhub-gpu demo`` simulates for an example's values (--print-node-pools)."""
    from jupyterhub_gpu.dev.demo import plan_demo, print_node_pools

    values = [HERE.parent / "helm-values/base.yaml", HERE.parent / f"helm-values/{example}.yaml"]
    return print_node_pools(plan_demo([str(v) for v in values]))


generated = HERE / "_generated"
generated.mkdir(exist_ok=True)
for name, text in {
    "spawner-traits.md": _spawner_traits(),
    "service-traits.md": _service_traits(),
    "ldap-traits.md": _ldap_traits(),
    "policy-keys.md": _policy_keys(),
    **{
        f"node-pools-{example}.yaml": _node_pools(example)
        for example in ("university", "department", "enterprise")
    },
}.items():
    path = generated / name
    if not path.exists() or path.read_text() != text:  # unchanged files keep Sphinx's cache
        path.write_text(text)
exclude_patterns.append("_generated")
