"""``GPUPolicy``: the one place an admin describes GPUs and groups.

Read from ``hub.config.GPUPolicy`` in z2jh values (or ``c.GPUPolicy`` in a
plain ``jupyterhub_config.py``) by the hub's spawner and by the service alike.
The traits hold the raw mappings exactly as YAML gives them; ``model`` checks
them all at once and returns the frozen policy model, or raises ``PolicyError``
listing every problem with its key path. The policy's traits take their help and
defaults from the table of its keys (``core.policy.settings``), where each key is
declared once.
"""

from __future__ import annotations

from traitlets import Bool, Dict, Enum, List, Unicode, Union, default, observe, validate
from traitlets.config import Configurable

from ..core.model import PREFIX, WHEN_FULL, Policy, PolicyError, parse_policy, unknown_settings
from ..core.policy.reference import trait_help
from ..core.policy.settings import SETTINGS


def _default(name: str):
    return SETTINGS[name].default


class GPUPolicy(Configurable):
    scheduler = Union([Unicode(), Dict()], help=trait_help("scheduler")).tag(config=True)
    flavors = Dict(help=trait_help("flavors")).tag(config=True)
    profiles = Dict(help=trait_help("profiles")).tag(config=True)
    everyone = Dict(help=trait_help("everyone")).tag(config=True)
    groups = Dict(help=trait_help("groups")).tag(config=True)
    when_full = Enum(
        list(WHEN_FULL), default_value=_default("when_full"), help=trait_help("when_full")
    ).tag(config=True)
    fair_share = Dict(None, allow_none=True, help=trait_help("fair_share")).tag(config=True)

    @default("fair_share")
    def _first_come_first_served(self) -> None:
        # traitlets would make an unset Dict {}: unset is off, not "on with no settings"
        return _default("fair_share")

    interfaces = Dict(help=trait_help("interfaces")).tag(config=True)
    datasets = Dict(help=trait_help("datasets")).tag(config=True)
    namespace_per_group = Bool(
        _default("namespace_per_group"), help=trait_help("namespace_per_group")
    ).tag(config=True)
    namespace_prefix = Unicode(
        _default("namespace_prefix"), help=trait_help("namespace_prefix")
    ).tag(config=True)
    adopt_namespaces = List(help=trait_help("adopt_namespaces")).tag(config=True)
    egress = Dict(None, allow_none=True, help=trait_help("egress")).tag(config=True)

    @default("egress")
    def _egress_unrestricted(self) -> None:
        # traitlets would make an unset Dict {}: unset is off, {} is on with the defaults
        return _default("egress")

    currency = Unicode(_default("currency"), allow_none=True, help=trait_help("currency")).tag(
        config=True
    )
    extra_labels = Dict(help=trait_help("extra_labels")).tag(config=True)
    adopted_servers_group = Unicode(
        _default("adopted_servers_group"),
        allow_none=True,
        help=trait_help("adopted_servers_group"),
    ).tag(config=True)
    adopted_servers_preemptible = Bool(
        _default("adopted_servers_preemptible"), help=trait_help("adopted_servers_preemptible")
    ).tag(config=True)

    accounting_url = Unicode(
        "sqlite:///jupyterhub-gpu-usage.sqlite",
        help="""
        The database GPU usage is recorded in (an SQLAlchemy URL): one row per
        server pod with its GPU-equivalents, start and end. The hub writes a
        server's start and stop; the service records every GPU pod it sees and
        closes those that ended while the hub was not looking. Budgets, history
        and showback are read from it, so it must outlive hub restarts. A
        relative sqlite path is relative to the hub's working directory (the
        service the hub starts shares it): in a z2jh hub pod that is
        ``/srv/jupyterhub``, the hub's volume, beside ``jupyterhub.sqlite``.
        Or point it at the hub's PostgreSQL.
        """,
    ).tag(config=True)

    accounting_fail_open = Bool(
        False,
        help="""
        What a GPU spawn does when the usage database cannot be read or written and
        a budget applies to it: refuse (``False``, the default: no budget can be
        exceeded unseen) or admit without the budget check (``True``: availability
        first). It holds from any failed read or write until what was kept is
        written and the rows are read again. The dashboard shows which is in force
        while the database is unavailable.
        """,
    ).tag(config=True)

    _model: Policy | None = None

    @default("scheduler")
    def _default_scheduler(self) -> dict:
        return dict(_default("scheduler"))

    @validate("scheduler")
    def _scheduler_by_name(self, proposal) -> dict:
        value = proposal["value"]
        return {"name": value} if isinstance(value, str) else value

    @observe(*SETTINGS)
    def _settings_changed(self, change) -> None:
        self._model = None  # the next read of ``model`` checks the new settings

    @property
    def model(self) -> Policy:
        """The checked policy; raises ``PolicyError`` listing every problem."""
        if self._model is None:
            given = self.config.GPUPolicy if "GPUPolicy" in self.config else {}
            unknown = unknown_settings(PREFIX, given, self.trait_names(config=True))
            try:
                model = parse_policy(**{name: getattr(self, name) for name in SETTINGS})
            except PolicyError as e:
                raise PolicyError(unknown + e.errors) from None
            if unknown:
                raise PolicyError(unknown)
            self._model = model
        return self._model
