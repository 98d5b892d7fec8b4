"""The hub image recipe and the versions it claims to support.

No Docker engine here: the Dockerfile is read, its install step's own command
is run, and the oldest supported versions (scripts/oldest-z2jh-hub.txt, which
scripts/test also runs the spawner tests against) are held to pyproject.toml's
dependency ranges.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from jupyterhub_gpu.config.hubconfig import CONFIG_D_FILE

ROOT = Path(__file__).parents[1]
DOCKERFILE = (ROOT / "images" / "hub" / "Dockerfile").read_text()
#: the z2jh charts this project supports (README, docs/index.md)
SUPPORTED_CHARTS = ("4.0.0", "4.1.0", "4.2.0", "4.3.0", "4.3.1", "4.3.2", "4.3.3", "4.3.4")
SUPPORTED_CHARTS += ("4.3.5", "4.4.0")


def oldest_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "scripts" / "oldest-z2jh-hub.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_image_builds_from_a_supported_chart_hub_image():
    (version,) = re.findall(r"^ARG K8S_HUB_VERSION=(\S+)$", DOCKERFILE, re.M)
    assert version in SUPPORTED_CHARTS
    assert re.search(r"^FROM quay\.io/jupyterhub/k8s-hub:\$\{K8S_HUB_VERSION\}$", DOCKERFILE, re.M)


def test_oldest_supported_versions_satisfy_our_dependencies():
    pins = oldest_pins()
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    checked = []
    for text in dependencies:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name in pins:
            assert requirement.specifier.contains(pins[name]), (text, pins[name])
            checked.append(name)
    assert {"jupyterhub", "jupyterhub-kubespawner", "kubernetes-asyncio"} <= set(checked)


def test_image_installs_the_startup_policy_check_where_z2jh_loads_it():
    # the path the RUN step copies from is what its own python3 -c command prints
    (snippet,) = re.findall(r"\$\(python3 -c '([^']+)'\)", DOCKERFILE)
    printed = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(printed) == CONFIG_D_FILE
    assert CONFIG_D_FILE.is_file()
    run = DOCKERFILE[DOCKERFILE.index("RUN ") :]
    words = shlex.split(run.replace("\\\n", " "))
    target = words[words.index("cp") + 2]
    assert target == "/usr/local/etc/jupyterhub/jupyterhub_config.d/jupyterhub-gpu.py"
