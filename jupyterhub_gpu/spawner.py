"""``jupyterhub_gpu.spawner.GPUKubeSpawner``: the name hub configs and the
``gpu-kubespawner`` entry point use for the spawner, which lives in
``jupyterhub_gpu.hub.spawner`` with the rest of the hub's code. Kept so that every
config naming it keeps working; new code imports from ``jupyterhub_gpu.hub``.
"""

from .hub.spawner import GPUKubeSpawner, SpawnRefused

__all__ = ["GPUKubeSpawner", "SpawnRefused"]
