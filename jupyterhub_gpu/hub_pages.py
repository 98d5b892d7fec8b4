"""``jupyterhub_gpu.hub_pages.show_last_stops``: an earlier home of the hub's pages
with each server's last stop, now ``jupyterhub_gpu.hub.pages``. Kept so that a
``jupyterhub_config.py`` calling it keeps working.
"""

from .hub.pages import show_last_stops

__all__ = ["show_last_stops"]
