"""Sphinx configuration of the jupyterhub-gpu documentation (MyST Markdown).

Built by scripts/test with warnings as errors:

    python3 -m sphinx -W --keep-going -b html docs docs/_build/html

The configuration reference is generated from the code: the traits of
``GPUPolicy``, ``GPUKubeSpawner``, ``GPUService`` and ``LDAPGroupsAuthenticator``
(autodoc-traits) and the policy's settings and the keys inside them (from the
one table of its keys, ``jupyterhub_gpu.core.policy``), written to
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


def _own_traits(cls, base, leave_out=()) -> str:
    """autotrait entries for the config traits ``cls`` adds to ``base``'s."""
    own = [
        name
        for name in cls.class_own_traits(config=True)
        if name not in base.class_traits(config=True) and name not in leave_out
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


def _policy_settings() -> str:
    """The policy's settings and the keys inside them, from the one table of its keys."""
    from jupyterhub_gpu.core.policy.reference import reference_markdown

    return reference_markdown()


def _policy_traits() -> str:
    """autotrait entries for GPUPolicy's traits that are not policy settings."""
    from traitlets.config import Configurable

    from jupyterhub_gpu.config.policy import GPUPolicy
    from jupyterhub_gpu.core.policy.settings import SETTINGS

    return _own_traits(GPUPolicy, Configurable, leave_out=SETTINGS.names)


def _node_pools(example: str) -> str:
    """What ``jupyterhub-gpu demo`` simulates for an example's values (--print-node-pools)."""
    from jupyterhub_gpu_dev.demo import plan_demo, print_node_pools

    values = [HERE.parent / "helm-values/base.yaml", HERE.parent / f"helm-values/{example}.yaml"]
    return print_node_pools(plan_demo([str(v) for v in values]))


generated = HERE / "_generated"
generated.mkdir(exist_ok=True)
for name, text in {
    "spawner-traits.md": _spawner_traits(),
    "service-traits.md": _service_traits(),
    "ldap-traits.md": _ldap_traits(),
    "policy-settings.md": _policy_settings(),
    "policy-traits.md": _policy_traits(),
    **{
        f"node-pools-{example}.yaml": _node_pools(example)
        for example in ("university", "department", "enterprise")
    },
}.items():
    path = generated / name
    if not path.exists() or path.read_text() != text:  # unchanged files keep Sphinx's cache
        path.write_text(text)
exclude_patterns.append("_generated")
