"""The JupyterLab extension (``jupyterlab-gpu/``) built once, cached by its sources' hash.

``ensure_labextension`` puts the built labextension into
``jupyterlab-gpu/jupyterhub_gpu_jupyterlab/labextension``, where the wheel picks it
up (so ``pip install ./jupyterlab-gpu`` never runs Node.js). The npm tree is
installed with ``npm ci`` from the committed lockfile into a cache folder keyed
by the lockfile's hash, and the build output into one keyed by every source's
hash: an unchanged extension is copied from the cache in a fraction of a second.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .localcluster import build

#: the extension's folder in a source checkout
SOURCE = Path(__file__).resolve().parents[2] / "jupyterlab-gpu"
#: what the build reads; a change to any of these is a new build
INPUTS = ("package.json", "package-lock.json", "tsconfig.json", "src", "style")
OUTPUT = Path("jupyterhub_gpu_jupyterlab") / "labextension"


def _hash(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path.relative_to(SOURCE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _files(source: Path) -> list[Path]:
    found: list[Path] = []
    for name in INPUTS:
        path = source / name
        found += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return found


def _run(argv: list[str], cwd: Path, what: str) -> None:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise build.BuildError(
            f"{what} failed in {cwd} (exit {result.returncode}):\n"
            + (result.stdout + result.stderr)[-3000:]
        )


def _build_tools(root: Path, lock_hash: str, say: Callable[[str], None]) -> Path:
    """The folder whose ``node_modules`` holds the extension's build tools (tsc, the
    JupyterLab builder), installed with ``npm ci`` unless they are (under the lock)."""
    modules = root / f"jupyterlab-gpu-modules-{lock_hash}"
    if not (modules / "node_modules" / ".bin" / "tsc").exists():
        npm = shutil.which("npm")
        if not npm:
            raise build.BuildError(
                "the JupyterLab extension is built with npm, and `npm` is not on PATH: "
                "install Node.js (20 or later)"
            )
        say(
            "installing the JupyterLab extension's build tools with npm ci "
            f"(the tree pinned in {SOURCE / 'package-lock.json'})"
        )
        shutil.rmtree(modules, ignore_errors=True)
        modules.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(SOURCE / name, modules / name)
        _run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], modules, "npm ci")
    return modules


def typescript_compiler(progress: Callable[[str], None] | None = None) -> Path:
    """The extension's own ``tsc`` (installed with its build tools, cached), for tests
    that run its plain modules (``src/words.ts``) in Node.js."""
    say = progress or (lambda text: print(text, file=sys.stderr))
    lock_hash = _hash([SOURCE / "package.json", SOURCE / "package-lock.json"])
    root = build.cache_dir() / "node"
    with build._lock(root / "jupyterlab-gpu.lock"):
        modules = _build_tools(root, lock_hash, say)
    return modules / "node_modules" / ".bin" / "tsc"


def ensure_labextension(progress: Callable[[str], None] | None = None) -> Path:
    """The built labextension in the source folder, built (or copied from the cache)."""
    say = progress or (lambda text: print(text, file=sys.stderr))
    if not (SOURCE / "package.json").exists():
        raise build.BuildError(f"the JupyterLab extension's sources are not at {SOURCE}")
    sources_hash = _hash(_files(SOURCE))
    lock_hash = _hash([SOURCE / "package.json", SOURCE / "package-lock.json"])
    root = build.cache_dir() / "node"
    built = root / f"jupyterlab-gpu-{sources_hash}" / "labextension"
    target = SOURCE / OUTPUT
    with build._lock(root / "jupyterlab-gpu.lock"):
        if not (built / "package.json").exists():
            started = time.monotonic()
            modules = _build_tools(root, lock_hash, say)
            say("building the JupyterLab extension (tsc, jupyter labextension build)")
            work = root / f"jupyterlab-gpu-build-{sources_hash}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            for name in INPUTS:
                source = SOURCE / name
                if source.is_dir():
                    shutil.copytree(source, work / name)
                else:
                    shutil.copyfile(source, work / name)
            (work / "node_modules").symlink_to(modules / "node_modules")
            _run([str(modules / "node_modules" / ".bin" / "tsc")], work, "tsc")
            _run(
                [sys.executable, "-m", "jupyter", "labextension", "build", "."],
                work,
                "jupyter labextension build",
            )
            staged = built.with_name("labextension.tmp")
            shutil.rmtree(staged, ignore_errors=True)
            shutil.copytree(work / OUTPUT, staged)
            staged.rename(built)
            shutil.rmtree(work, ignore_errors=True)
            say(f"built the JupyterLab extension in {time.monotonic() - started:.0f}s")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(built, target)
    return target


#: where ``pip install ./jupyterlab-gpu`` puts the labextension JupyterLab loads
INSTALLED = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "jupyterhub-gpu-jupyterlab"


def ensure_installed(progress: Callable[[str], None] | None = None) -> bool:
    """The extension built (cached) and installed into this environment, as the demo's
    servers need it; reinstalled when its sources changed. Whether it installed now."""
    built = ensure_labextension(progress)
    found = INSTALLED / "package.json"
    if found.exists() and found.read_bytes() == (built / "package.json").read_bytes():
        return False  # the same build (its package.json names its bundle's hash)
    say = progress or (lambda text: print(text, file=sys.stderr))
    say(f"installing the JupyterLab extension into {sys.prefix} (pip install {SOURCE})")
    _run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "."],
        SOURCE,
        "pip install of the JupyterLab extension",
    )
    return True


if __name__ == "__main__":
    ensure_labextension()
