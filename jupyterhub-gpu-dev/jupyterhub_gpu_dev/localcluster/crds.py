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
from collections.abc import Callable
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
    files: tuple[str, ...]  # file names in folder


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
        # every one of them: Volcano's scheduler and controllers, when the cluster runs
        # them, wait for informers on all of them
        (
            "scheduling.volcano.sh_queues.yaml",
            "scheduling.volcano.sh_podgroups.yaml",
            "batch.volcano.sh_jobs.yaml",
            "bus.volcano.sh_commands.yaml",
            "nodeinfo.volcano.sh_numatopologies.yaml",
        ),
    ),
    CrdSource(
        "kueue",
        "sigs.k8s.io/kueue",
        "config/components/crd/bases",
        # every one of them: Kueue's manager, when the cluster runs it, watches them all
        (
            "kueue.x-k8s.io_resourceflavors.yaml",
            "kueue.x-k8s.io_clusterqueues.yaml",
            "kueue.x-k8s.io_localqueues.yaml",
            "kueue.x-k8s.io_cohorts.yaml",
            "kueue.x-k8s.io_workloads.yaml",
            "kueue.x-k8s.io_admissionchecks.yaml",
            "kueue.x-k8s.io_workloadpriorityclasses.yaml",
            "kueue.x-k8s.io_provisioningrequestconfigs.yaml",
            "kueue.x-k8s.io_multikueueconfigs.yaml",
            "kueue.x-k8s.io_multikueueclusters.yaml",
            "kueue.x-k8s.io_topologies.yaml",
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


async def install(
    api_client: Any,
    scheduler: str,
    within: float = 60,
    adapt: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> list[str]:
    """Create a scheduler's CRDs in a cluster (those missing) and wait until they serve.

    ``api_client`` is a kubernetes_asyncio ApiClient; ``adapt`` changes each CRD
    before it is created (e.g. to convert through a webhook the cluster runs).
    Returns the CRD names.
    """
    import asyncio
    import time

    from kubernetes_asyncio import client

    ext = client.ApiextensionsV1Api(api_client)
    names = []
    for crd in crds(scheduler):
        crd = adapt(crd) if adapt else crd
        names.append(crd["metadata"]["name"])
        try:
            await ext.create_custom_resource_definition(crd)
        except client.ApiException as e:
            if e.status != 409:  # already there
                raise
    deadline = time.monotonic() + within
    for name in names:
        while True:
            crd = await ext.read_custom_resource_definition(name)
            conditions = {c.type: c.status for c in (crd.status.conditions or [])}
            established = conditions.get("Established") == "True"
            established = established and not crd.metadata.deletion_timestamp
            if established and await _serves(api_client, crd):
                break
            if time.monotonic() > deadline:
                raise BuildError(f"CRD {name} not established within {within}s: {conditions}")
            await asyncio.sleep(0.2)
    return names


async def _serves(api_client: Any, crd: Any) -> bool:
    """True once the API server lists the CRD's objects (its storage may still start)."""
    from kubernetes_asyncio import client

    version = next(v.name for v in crd.spec.versions if v.storage)
    custom = client.CustomObjectsApi(api_client)
    try:
        await custom.list_cluster_custom_object(crd.spec.group, version, crd.spec.names.plural)
    except client.ApiException as e:
        if e.status in (404, 429, 503):
            return False
        raise
    return True


async def uninstall(api_client: Any, scheduler: str, within: float = 60) -> None:
    """Delete a scheduler's CRDs (and so every object of theirs) and wait until gone."""
    import asyncio
    import time

    from kubernetes_asyncio import client

    ext = client.ApiextensionsV1Api(api_client)
    deadline = time.monotonic() + within
    for crd in crds(scheduler):
        name = crd["metadata"]["name"]
        try:
            await ext.delete_custom_resource_definition(name)
        except client.ApiException as e:
            if e.status != 404:
                raise
        while True:
            try:
                await ext.read_custom_resource_definition(name)
            except client.ApiException as e:
                if e.status == 404:
                    break
                raise
            if time.monotonic() > deadline:
                raise BuildError(f"CRD {name} still there after {within}s")
            await asyncio.sleep(0.2)
