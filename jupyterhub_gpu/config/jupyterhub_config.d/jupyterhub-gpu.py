# jupyterhub-gpu: refuse to start the hub with a broken GPU policy.
# The hub image copies this file into /usr/local/etc/jupyterhub/jupyterhub_config.d/,
# which z2jh's jupyterhub_config.py loads after applying hub.config.
from jupyterhub_gpu.config.hubconfig import check_z2jh_values

check_z2jh_values()
