"""The hub's room: ``GPUKubeSpawner`` and its parts, the hub's pages, the offline
runner behind ``jupyterhub-gpu profiles`` and ``pod``, and the hub's classes as
``check`` resolves them. It reads the core, the configuration, the Kubernetes layer
and the usage database, never the GPU service.
"""
