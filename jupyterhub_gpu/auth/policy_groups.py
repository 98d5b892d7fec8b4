"""What the bundle's authenticators share: they exist to set each user's hub groups
from the identity provider (``manage_groups``), kept to the groups the policy names."""

from __future__ import annotations

import re
from typing import Any

from ..config.policy import GPUPolicy
from ..core.model import Policy

# the requests that start a server: the spawn page and the REST API's server start
_SPAWN_PAGE = re.compile(r"/hub/spawn(/|$)")
_SPAWN_API = re.compile(r"/hub/api/users/[^/]+/servers?(/[^/]*)?/?$")


def is_spawn(handler: Any) -> bool:
    """Whether the request ``handler`` serves starts a server (the spawn form, or
    the REST API's ``POST .../server``)."""
    request = getattr(handler, "request", None)
    if request is None:
        return False
    if _SPAWN_PAGE.search(request.path):
        return True
    return request.method == "POST" and bool(_SPAWN_API.search(request.path))


class PolicyGroups:
    """Mixed into an authenticator (before its JupyterHub base class)."""

    _policy_settings: GPUPolicy | None = None

    def require_manage_groups(self, source: str, stock: str) -> None:
        """Refuse to start without ``manage_groups`` (``source``: where groups come
        from; ``stock``: the authenticator to use to leave groups to the admin page)."""
        if not self.manage_groups:  # type: ignore[attr-defined]
            raise ValueError(
                f"{type(self).__name__}.manage_groups must be True: it exists to set the "
                f"user's groups from {source} (to leave groups to the admin page, use "
                f"{stock})"
            )

    @property
    def gpu_policy(self) -> Policy:
        """The hub's policy (``GPUPolicy``), whose groups are the ones kept."""
        if self._policy_settings is None:
            self._policy_settings = GPUPolicy(config=self.config)  # type: ignore[attr-defined]
        return self._policy_settings.model
