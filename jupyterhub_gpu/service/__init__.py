"""The jupyterhub-gpu hub service: views, runtime rules, capacity.

Run by the hub as a managed service (``jupyterhub-gpu-service`` or
``python -m jupyterhub_gpu.service``); see ``app.GPUService``.
"""
