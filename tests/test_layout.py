"""The package's layout holds: the pure core imports no I/O library (a lint rule
enforces it), and the hub and the service never import the local cluster or the demo,
so a hub image without the ``[demo]`` extra works."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VALUES = ROOT / "helm-values"

# Python run in a fresh interpreter that cannot import the [demo] extra's packages,
# as in a hub image built without it.
WITHOUT_DEMO_EXTRA = textwrap.dedent(
    """
    import importlib.abc, sys

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("cryptography", "jupyterlab"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    """
)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_DEMO_EXTRA + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_the_hub_and_the_service_import_nothing_of_the_demo_extra():
    result = _python(
        """
        import jupyterhub_gpu.spawner, jupyterhub_gpu.service.app, jupyterhub_gpu.config.hubconfig
        import jupyterhub_gpu.cli
        print(sorted(m for m in sys.modules
                     if m.startswith(("jupyterhub_gpu.dev", "cryptography", "jupyterlab"))))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_offline_commands_work_without_the_demo_extra_and_the_cluster_says_what_to_install():
    values = [str(VALUES / "base.yaml"), str(VALUES / "university.yaml")]
    result = _python(
        f"""
        from jupyterhub_gpu.cli import main
        assert main(["check", *{values!r}]) == 0
        assert main(["manifests", *{values!r}]) == 0
        sys.exit(main(["cluster", "status"]))
        """
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("policy OK")
    assert "kind: ClusterRole" in result.stdout  # the manifests were rendered
    assert "need the [demo] extra (cryptography is missing)" in result.stderr
    assert "pip install 'jupyterhub-gpu[demo]'" in result.stderr


def _ruff_on_core(source: str) -> subprocess.CompletedProcess:
    """``ruff check`` of ``source`` as if it were a module in jupyterhub_gpu/core/."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--output-format",
            "concise",
            "--stdin-filename",
            str(ROOT / "jupyterhub_gpu/core/probe.py"),
            "-",
        ],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_the_lint_rule_keeps_io_out_of_the_core():
    bad = textwrap.dedent(
        """
        from kubernetes_asyncio.client import ApiException
        from tornado import web
        from ..kube import client
        from jupyterhub_gpu.spawner import GPUKubeSpawner

        __all__ = ["ApiException", "GPUKubeSpawner", "client", "web"]
        """
    )
    result = _ruff_on_core(bad)
    assert result.returncode == 1
    for banned in (
        "kubernetes_asyncio",
        "tornado",
        "jupyterhub_gpu.kube",
        "jupyterhub_gpu.spawner",
    ):
        assert f"`{banned}` is banned" in result.stdout, result.stdout

    # the core's own siblings and the standard library's pure modules pass
    good = (
        "from fractions import Fraction\n\nfrom .model import Policy\n\n"
        '__all__ = ["Fraction", "Policy"]\n'
    )
    assert _ruff_on_core(good).returncode == 0
