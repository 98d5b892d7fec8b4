"""The package's layout holds: the pure core imports no I/O library (a ruff rule), each
room imports only the rooms below it (core <- config, kube, accounting <- hub, service,
auth <- dev <- cli; import-linter's contract in pyproject.toml), and the hub and the
service never import the local cluster or the demo (a distribution of their own,
jupyterhub-gpu-dev), so a hub image without it works."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VALUES = ROOT / "helm-values"
#: the local cluster's and the demo's distribution, beside the package
DEV_FOLDER = "jupyterhub-gpu-dev"

# Python run in a fresh interpreter that cannot import the local cluster and the demo
# (the jupyterhub-gpu-dev distribution) nor what they bring, as in a hub image.
WITHOUT_DEV = textwrap.dedent(
    """
    import importlib.abc, sys

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("jupyterhub_gpu_dev", "cryptography", "jupyterlab"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    """
)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_DEV + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_the_hub_and_the_service_import_nothing_of_the_local_cluster_or_the_demo():
    result = _python(
        """
        import jupyterhub_gpu.hub.spawner, jupyterhub_gpu.service.app
        import jupyterhub_gpu.config.hubconfig, jupyterhub_gpu.cli
        print(sorted(m for m in sys.modules
                     if m.startswith(("jupyterhub_gpu_dev", "cryptography", "jupyterlab"))))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_offline_commands_work_without_the_dev_distribution_and_cluster_says_what_to_install():
    values = [str(VALUES / "base.yaml"), str(VALUES / "university.yaml")]
    result = _python(
        f"""
        from jupyterhub_gpu.cli import main
        assert main(["check", *{values!r}]) == 0
        assert main(["manifests", *{values!r}, "--hub-namespace", "jhub"]) == 0
        sys.exit(main(["cluster", "status"]))
        """
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("policy OK")
    assert "kind: ClusterRole" in result.stdout  # the manifests were rendered
    assert "the local cluster and the demo come with the jupyterhub-gpu-dev distribution" in (
        result.stderr
    )
    assert "pip install -e ./jupyterhub-gpu-dev" in result.stderr


def _ruff(*args: str, source: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise", *args],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def _ruff_as(module: str, source: str) -> subprocess.CompletedProcess:
    """``ruff check`` of ``source`` as if it were the module at ``module`` (a path in
    jupyterhub_gpu/), with the lint rules of its folder."""
    return _ruff("--stdin-filename", str(ROOT / "jupyterhub_gpu" / module), "-", source=source)


def test_the_lint_rule_keeps_io_out_of_the_core():
    bad = textwrap.dedent(
        """
        import os
        from kubernetes_asyncio.client import ApiException
        from tornado import web

        __all__ = ["ApiException", "os", "web"]
        """
    )
    result = _ruff_as("core/probe.py", bad)
    assert result.returncode == 1
    for banned in ("kubernetes_asyncio", "tornado", "os"):
        assert f"`{banned}` is banned" in result.stdout, result.stdout

    # the core's own siblings and the standard library's pure modules pass
    good = (
        "from fractions import Fraction\n\nfrom .model import Policy\n\n"
        '__all__ = ["Fraction", "Policy"]\n'
    )
    assert _ruff_as("core/probe.py", good).returncode == 0


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's check of the package at ``root`` (its pyproject.toml's contract)."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())",
            "--no-cache",
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / DEV_FOLDER}"},
        timeout=120,
    )


def test_the_package_keeps_its_rooms():
    """Every import in the package, at the top of a module or inside a function, goes
    down the floors of pyproject.toml's contract (the same check as the lint step)."""
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


#: (the module an import is added to, the import, what it breaks): a room importing a
#: room above it, or a room beside it on its floor
AGAINST_THE_FLOORS = [
    ("core/probe.py", "from ..config import policy", "core -> config"),
    ("config/probe.py", "from ..kube import client", "config -> kube"),
    ("kube/probe.py", "from ..accounting import store", "kube -> accounting"),
    ("accounting/probe.py", "from ..hub import spawner", "accounting -> hub"),
    ("hub/probe.py", "from ..service import app", "hub -> service"),
    ("service/probe.py", "from ..hub import spawner", "service -> hub"),
    ("auth/probe.py", "from ..hub import pages", "auth -> hub"),
    # the local cluster and the demo, a distribution of their own, even lazily
    (
        "hub/probe.py",
        "def f():\n    from jupyterhub_gpu_dev import demo\n\n    return demo",
        "hub -> jupyterhub_gpu_dev.demo",
    ),
    ("service/probe.py", "import jupyterhub_gpu_dev.prometheus", "service -> jupyterhub_gpu_dev"),
]


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory) -> Path:
    """The package and its contract, copied, for imports the real one must not have."""
    root = tmp_path_factory.mktemp("layout")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    for package in ("jupyterhub_gpu", f"{DEV_FOLDER}/jupyterhub_gpu_dev"):
        shutil.copytree(
            ROOT / package,
            root / package,
            ignore=shutil.ignore_patterns("__pycache__", "gomod", "node_modules", "*.html"),
        )
    return root


@pytest.mark.parametrize(("module", "line", "broken"), AGAINST_THE_FLOORS)
def test_an_import_against_the_floors_is_a_lint_error(package_copy, module, line, broken):
    probe = package_copy / "jupyterhub_gpu" / module
    probe.write_text(line + "\n")
    try:
        result = _lint_imports(package_copy)
    finally:
        probe.unlink()
    assert result.returncode == 1, result.stdout
    assert "BROKEN" in result.stdout
    importer, imported = broken.split(" -> ")
    if not imported.startswith("jupyterhub_gpu_dev"):
        imported = f"jupyterhub_gpu.{imported}"
    assert f"jupyterhub_gpu.{importer}.probe -> {imported}" in result.stdout, result.stdout
