"""The package's layout holds: the pure core imports no I/O library, dependencies point
one way (core <- config <- kube <- spawner and service; lint rules enforce both), and
the hub and the service never import the local cluster or the demo, so a hub image
without the ``[demo]`` extra works."""

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
        assert main(["manifests", *{values!r}, "--hub-namespace", "jhub"]) == 0
        sys.exit(main(["cluster", "status"]))
        """
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("policy OK")
    assert "kind: ClusterRole" in result.stdout  # the manifests were rendered
    assert "need the [demo] extra (cryptography is missing)" in result.stderr
    assert "pip install 'jupyterhub-gpu[demo]'" in result.stderr


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
        from kubernetes_asyncio.client import ApiException
        from tornado import web
        from ..kube import client
        from jupyterhub_gpu.spawner import GPUKubeSpawner

        __all__ = ["ApiException", "GPUKubeSpawner", "client", "web"]
        """
    )
    result = _ruff_as("core/probe.py", bad)
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
    assert _ruff_as("core/probe.py", good).returncode == 0


#: what each layer must not import: everything above it
#: the spawner's parts beside it
SPAWNER_PARTS = (
    "spawn_checks",
    "spawn_profiles",
    "spawn_progress",
    "server_pods",
    "queue_watch",
    "server_exit",
)
ABOVE = {
    "config": ("kube", "service", "spawner", "spawn_admission", *SPAWNER_PARTS, "dev"),
    "kube": ("service", "spawner", "spawn_admission", *SPAWNER_PARTS, "dev"),
}


def test_the_lint_rule_keeps_the_layers_pointing_one_way():
    """config/ reads the core only, kube/ the core and config/: an import of a layer
    above, relative or absolute, at the top or inside a function, is a lint error."""
    for layer, above in ABOVE.items():
        for name in above:
            for line in (
                f"from ..{name} import something",
                f"import jupyterhub_gpu.{name}",
                # inside a function, as a lazy import would be
                f"def f():\n    from jupyterhub_gpu.{name} import x\n\n    return x",
            ):
                source = f"{line}\n\n__all__ = []\n"
                result = _ruff_as(f"{layer}/probe.py", source)
                assert result.returncode == 1, (layer, line)
                assert f"`jupyterhub_gpu.{name}` is banned: {layer}/ must not" in result.stdout, (
                    result.stdout
                )

    # what lies below passes
    good = {
        "config": "from ..core.model import Policy\nfrom .policy import GPUPolicy\n",
        "kube": "from ..config.policy import GPUPolicy\nfrom ..core.model import Policy\n",
    }
    for layer, imports in good.items():
        result = _ruff_as(f"{layer}/probe.py", f'{imports}\n__all__ = ["GPUPolicy", "Policy"]\n')
        assert result.returncode == 0, (layer, result.stdout)


def test_the_package_keeps_its_layers():
    """The package as it is: no layer imports one above it (the same rules as the lint
    step, so running the tests alone catches such an import too)."""
    result = _ruff("--select", "TID251", "jupyterhub_gpu")
    assert result.returncode == 0, result.stdout
