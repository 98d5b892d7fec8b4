"""Stop the hub at start-up when the GPU policy is wrong (DESIGN §3).

JupyterHub imports the spawner class while it is still loading its config and
creates spawners only when users start servers, so ``GPUKubeSpawner`` itself
would find a broken policy only at the first spawn. Instead the check runs as
soon as the hub loads its config. z2jh's ``jupyterhub_config.py`` loads every
file in ``/usr/local/etc/jupyterhub/jupyterhub_config.d/``, and the hub image
(``images/hub/Dockerfile``) puts ``jupyterhub_config.d/jupyterhub-gpu.py`` from
this package there. traitlets gives such a file a config of its own, so it reads
the policy where z2jh itself reads it, from the chart values
(``z2jh.get_config("hub.config.GPUPolicy")``) — ``check_z2jh_values``. A plain
``jupyterhub_config.py`` ends with::

    from jupyterhub_gpu.hubconfig import check_policy
    check_policy(c)

On an error the hub exits with status 1 before it binds any port, printing every
problem with its key path (the same report as ``jupyterhub-gpu check``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from traitlets.config import Config

from .model import PolicyError
from .values import policy_from_config

#: the file the hub image installs into z2jh's jupyterhub_config.d
CONFIG_D_FILE = Path(__file__).parent / "jupyterhub_config.d" / "jupyterhub-gpu.py"


def check_policy(config: Config, stream: TextIO | None = None) -> None:
    """Exit (status 1) with every policy error listed; return quietly when the policy is good."""
    try:
        policy = policy_from_config(config)
    except PolicyError as e:
        out = stream or sys.stderr
        print(
            f"jupyterhub-gpu: the GPU policy has {len(e.errors)} "
            f"error{'s' if len(e.errors) != 1 else ''}; the hub will not start:",
            file=out,
        )
        for error in e.errors:
            print(f"  {error}", file=out)
        print("Fix hub.config.GPUPolicy (check with `jupyterhub-gpu check VALUES`).", file=out)
        out.flush()
        raise SystemExit(1) from None
    print(
        f"jupyterhub-gpu: GPU policy checked: {len(policy.groups)} groups, "
        f"{len(policy.profiles)} profiles, {len(policy.flavors)} flavors",
        file=stream or sys.stderr,
    )


def check_z2jh_values() -> None:
    """In a z2jh hub pod: check ``hub.config.GPUPolicy`` from the chart values.

    Outside z2jh (no ``z2jh`` helper module on the path) there is nothing to read
    and nothing happens; ``hub.extraConfig`` that changes ``c.GPUPolicy`` is not
    seen here (spawns still check the final policy).
    """
    try:
        from z2jh import get_config  # the chart's helper, beside jupyterhub_config.py
    except ImportError:
        return
    config = Config()
    config.GPUPolicy.update(get_config("hub.config.GPUPolicy", None) or {})
    check_policy(config)
