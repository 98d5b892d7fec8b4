"""The policy an admin writes under ``hub.config.GPUPolicy``, in parts: ``schema`` (how a
key is declared and read), ``keys`` and ``settings`` (every key, declared once),
``checks`` (single keys' checks beyond their type), ``sections`` and ``parse`` (the
parser), ``types`` (the model it returns) and ``reference`` (the help and the docs
written from the keys). ``jupyterhub_gpu.core.model`` gathers the names the rest of
the package uses.
"""
