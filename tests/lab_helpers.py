"""The JupyterLab extension's plain modules (``jupyterlab-gpu/src/words.ts`` and
``messages.ts``: no JupyterLab in them) run in Node.js, for the tests and the message
catalogue: compiled once per process with the extension's own ``tsc``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from jupyterhub_gpu_dev.labextension import SOURCE, typescript_compiler

MODULES = ("words.ts", "messages.ts")
_compiled: Path | None = None


def compiled() -> Path:
    """A folder with the modules compiled to CommonJS (``words.js``, ``messages.js``)."""
    global _compiled
    if _compiled is None or not (_compiled / "messages.js").exists():
        tsc = typescript_compiler(lambda text: None)
        out = Path(tempfile.mkdtemp(prefix="jupyterhub-gpu-lab-"))
        sources = [str(SOURCE / "src" / name) for name in MODULES]
        result = subprocess.run(
            [str(tsc), "--module", "commonjs", "--target", "ES2020", "--lib", "ES2020",
             "--strict", "--outDir", str(out), *sources],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if result.returncode != 0:
            shutil.rmtree(out, ignore_errors=True)
            raise RuntimeError(f"tsc failed:\n{result.stdout}{result.stderr}")
        _compiled = out
    return _compiled


def run(script: str, data: Any, tz: str = "UTC") -> Any:
    """Run ``script`` in Node.js with ``words`` and ``messages`` loaded and ``data`` (as
    JSON) in ``data``, in time zone ``tz``; what it assigns to ``result``, as JSON."""
    folder = compiled()
    program = (
        f"const words = require({json.dumps(str(folder / 'words.js'))});\n"
        f"const messages = require({json.dumps(str(folder / 'messages.js'))});\n"
        f"const data = {json.dumps(data)};\n"
        "let result = null;\n"
        f"{script}\n"
        "process.stdout.write(JSON.stringify(result));\n"
    )
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("Node.js (`node`) is not on PATH: install Node.js 20 or later")
    result = subprocess.run(
        [node, "-e", program],
        capture_output=True,
        text=True,
        env={**os.environ, "TZ": tz},
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"node failed:\n{result.stderr}")
    return json.loads(result.stdout)
