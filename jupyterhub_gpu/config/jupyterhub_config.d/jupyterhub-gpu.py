# jupyterhub-gpu: refuse to start the hub with a broken GPU policy, and show on the
# hub's home and spawn pages why each of the user's servers last stopped.
# The hub image copies this file into /usr/local/etc/jupyterhub/jupyterhub_config.d/,
# which z2jh's jupyterhub_config.py loads after applying hub.config.
from jupyterhub_gpu.config.hubconfig import check_z2jh_values
from jupyterhub_gpu.hub.pages import show_last_stops

check_z2jh_values()
show_last_stops(get_config())  # noqa: F821 (the config loader's own)
