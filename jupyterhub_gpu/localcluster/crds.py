"""The scheduler CRDs (KAI, Volcano, Kueue), read from their own Go modules.

``gomod/crds/go.mod`` pins each project; ``go mod download -json`` puts its
module zip in the Go module cache and names the extracted folder, and the CRD
YAML files are read from there: no third-party file is committed. Which folder
of each module holds its CRDs is below (each was checked to be inside the
module zip, i.e. not a nested module with its own go.mod).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .build import GOMOD, BuildError, _go, _go_env

MODULE_DIR = GOMOD / "crds"


@dataclass(frozen=True)
class CrdSource:
    scheduler: str
    module: str
    folder: str  # inside the module
    files: tuple[str, ...]  # file names in folder; () means every *.yaml


SOURCES = (
    CrdSource(
        "kai",
        "github.com/NVIDIA/KAI-scheduler",
        "deployments/kai-scheduler/crds",
        ("scheduling.run.ai_queues.yaml",),
    ),
    CrdSource(
        "volcano",
        "volcano.sh/volcano",
        "config/crd/volcano/bases",
        ("scheduling.volcano.sh_queues.yaml",),
    ),
    CrdSource(
        "kueue",
        "sigs.k8s.io/kueue",
        "config/components/crd/bases",
        (
            "kueue.x-k8s.io_resourceflavors.yaml",
            "kueue.x-k8s.io_clusterqueues.yaml",
            "kueue.x-k8s.io_localqueues.yaml",
            "kueue.x-k8s.io_cohorts.yaml",
        ),
    ),
)


def pinned_versions() -> dict[str, str]:
    """Module path -> version, as our go.mod pins them."""
    text = (MODULE_DIR / "go.mod").read_text()
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\s*(?:require\s+)?(\S+)\s+(v\S+)\s*$", text, re.M)
    }


@functools.cache
def module_dirs() -> dict[str, Path]:
    """Module path -> its folder in the Go module cache (downloaded on first use)."""
    modules = [s.module for s in SOURCES]
    out = subprocess.run(
        [_go(), "mod", "download", "-json", *modules],
        cwd=MODULE_DIR,
        env=_go_env(),
        capture_output=True,
        text=True,
    )
    dirs: dict[str, Path] = {}
    decoder = json.JSONDecoder()
    text, pos = out.stdout, 0
    while pos < len(text.rstrip()):
        while text[pos].isspace():
            pos += 1
        info, pos = decoder.raw_decode(text, pos)
        if info.get("Error"):
            raise BuildError(f"go mod download {info.get('Path')}: {info['Error']}")
        dirs[info["Path"]] = Path(info["Dir"])
    if out.returncode != 0 or set(dirs) != set(modules):
        raise BuildError(f"go mod download in {MODULE_DIR} failed:\n{out.stderr[-4000:]}")
    return dirs


def crd_files(scheduler: str) -> list[Path]:
    """The CRD files of one scheduler (kai, volcano, kueue), checked to exist."""
    dirs = module_dirs()
    files = []
    for source in SOURCES:
        if source.scheduler != scheduler:
            continue
        folder = dirs[source.module] / source.folder
        for name in source.files:
            path = folder / name
            if not path.is_file():
                raise BuildError(
                    f"{source.module} {pinned_versions().get(source.module)}: no {source.folder}/"
                    f"{name} in its module; pin a version that ships it in gomod/crds/go.mod"
                )
            files.append(path)
    if not files:
        raise ValueError(f"no CRDs known for scheduler {scheduler!r}")
    return files


def crds(scheduler: str) -> list[dict[str, Any]]:
    """The CustomResourceDefinition objects of one scheduler."""
    return [
        doc
        for path in crd_files(scheduler)
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "CustomResourceDefinition"
    ]
