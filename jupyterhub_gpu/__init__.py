"""jupyterhub-gpu: fair, self-service GPU notebooks on one shared Kubernetes cluster."""

__version__ = "0.1.0.dev0"
