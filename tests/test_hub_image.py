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

import pytest
import yaml
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


# --- every image's Dockerfile, parsed ---------------------------------------------

IMAGES = ROOT / "images"
DOCKERFILES = sorted(p for p in IMAGES.rglob("Dockerfile*") if p.is_file())
SINGLE_USER = [p for p in DOCKERFILES if p.parent.name == "singleuser"]
#: the bundle's authenticators and the extra each needs in the hub image
AUTHENTICATOR_EXTRAS = {"ldap-groups": "ldap", "oidc-groups": "oidc"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order: continuation lines joined, comments out."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def base_image(path: Path) -> str:
    """The FROM image with the ARG defaults declared before it filled in."""
    args: dict[str, str] = {}
    for word, rest in instructions(path):
        if word == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name] = default.strip('"')
        if word == "FROM":
            return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
    raise AssertionError(f"{path}: no FROM")


def test_the_images_are_the_hub_and_the_single_user_ones():
    assert {str(p.relative_to(IMAGES)) for p in DOCKERFILES} == {
        "hub/Dockerfile",
        "singleuser/Dockerfile",
        "singleuser/Dockerfile.vscode",
    }


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(IMAGES)))
def test_every_image_starts_from_a_pinned_image(path):
    # a moving base (no tag, latest, cuda12-latest) rebuilds into another image under
    # the same tag: nodes that have the old one never pull it
    image = base_image(path)
    name, _, tag = image.rpartition(":")
    assert "/" in name, image
    assert tag, image
    assert tag != "latest", image
    assert not tag.endswith("-latest"), image


def test_hub_image_installs_the_extras_its_build_arg_names():
    steps = instructions(ROOT / "images" / "hub" / "Dockerfile")
    kinds = [w for w, _ in steps]
    # declared after FROM, or the RUN would not see it
    assert ("ARG", 'EXTRAS=""') in steps
    assert steps.index(("ARG", 'EXTRAS=""')) > kinds.index("FROM")
    run = next(rest for w, rest in steps if w == "RUN" and "pip install" in rest)
    (assignment,) = re.findall(r'spec="[^"]+"', run)
    assert 'python3 -m pip install --no-cache-dir "$spec"' in run
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def spec(extras: str) -> str:
        return subprocess.run(
            ["sh", "-c", f'{assignment}; printf %s "$spec"'],
            env={"EXTRAS": extras, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    assert spec("") == "/tmp/jupyterhub-gpu"  # pip refuses an empty "[]"
    for extras in ("ldap", "oidc", "ldap,oidc"):
        assert spec(extras) == f"/tmp/jupyterhub-gpu[{extras}]"
    # each extra an authenticator of the bundle needs is one pip knows
    for extra in AUTHENTICATOR_EXTRAS.values():
        assert extra in optional
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        "jupyterhub.authenticators"
    ]
    assert set(entry_points) == set(AUTHENTICATOR_EXTRAS)


@pytest.mark.parametrize("example", ["university", "department", "enterprise"])
def test_the_deploy_guide_names_the_extra_each_example_needs(example):

    values = yaml.safe_load((ROOT / "helm-values" / f"{example}.yaml").read_text())
    authenticator = values["hub"]["config"]["JupyterHub"].get("authenticator_class")
    extra = AUTHENTICATOR_EXTRAS.get(authenticator, "")
    guide = (ROOT / "docs" / "deploy.md").read_text()
    rows = [line for line in guide.splitlines() if f"| {example} |" in line]
    assert len(rows) == 1, rows
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert cells[-1] == (f"`{extra}`" if extra else "(empty)"), rows[0]


@pytest.mark.parametrize("path", SINGLE_USER, ids=lambda p: p.name)
def test_every_single_user_image_installs_the_jupyterlab_extension(path):
    # without it users see no GPU time in JupyterLab, get no warning before a stop and
    # nothing is saved first
    project = tomllib.loads((ROOT / "jupyterlab-gpu" / "pyproject.toml").read_text())
    assert project["project"]["name"] == "jupyterhub-gpu-jupyterlab"
    wheel = "jupyterhub_gpu_jupyterlab-*.whl"  # the wheel's file name for that project
    steps = instructions(path)
    assert ("COPY", f"dist/{wheel} /tmp/") in steps
    installs = [
        shlex.split(rest) for word, rest in steps if word == "RUN" and "pip install" in rest
    ]
    assert any(f"/tmp/{wheel}" in words for words in installs), installs
    # after FROM, in the image's own Python, not a build stage of another base
    kinds = [w for w, _ in steps]
    assert kinds.count("FROM") == 1
    assert kinds.index("COPY") > kinds.index("FROM")
