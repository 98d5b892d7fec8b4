"""``python3 -m jupyterhub_gpu.cli``: the ``jupyterhub-gpu`` command."""

import sys

from . import main

sys.exit(main())
