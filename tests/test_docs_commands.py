"""The commands the docs print, run as printed.

Every shell block of the README and the docs is read. Each ``jupyterhub-gpu check``,
``profiles``, ``pod`` and ``manifests`` command (the first command of a pipe) runs as
printed, from a folder laid out like the repository's root, with the files the docs
name: the repository's own, those their ``cp`` lines make (``my-cluster.yaml``) and
those a YAML block introduces by name (``# site-secrets.yaml: not committed``). Each
must exit 0. Helm is not here, so each ``helm`` line is held to what it would install:
the release in ``jhub``, files that exist, keys the chart accepts
(tests/z2jh_schema.py) and a policy ``check`` accepts. ``kubectl`` lines that name the
release's namespace name ``jhub``; ``docker build`` lines name Dockerfiles, build
arguments and contexts that exist, and the hub image's tag is the bundle's version and
the chart's, as in ``helm-values/base.yaml``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import jupyterhub_gpu
import z2jh_schema
from jupyterhub_gpu.config.values import load_values

ROOT = Path(__file__).parents[1]
NAMESPACE = "jhub"
DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "images" / "singleuser" / "README.md",
        *(p for p in (ROOT / "docs").rglob("*.md") if not {"_build", "_generated"} & set(p.parts)),
    ]
)
SHELL = {"bash", "sh", "shell", "console"}
OFFLINE = {"check", "profiles", "pod", "manifests"}
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<lang>[\w{}-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)


@dataclass(frozen=True)
class Command:
    doc: str
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.doc}: {shlex.join(self.argv)}"


def blocks(path: Path) -> list[tuple[str, str]]:
    """``(language, body)`` of each fenced block, its indentation removed."""
    found = []
    for m in FENCE.finditer(path.read_text()):
        indent = len(m["indent"])
        body = "\n".join(line[indent:] for line in m["body"].splitlines())
        found.append((m["lang"], body))
    return found


def segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line: split at ``|``, ``&&``, ``;`` and ``>``
    (what follows a ``>`` is a file name, not a command)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    found: list[list[str]] = [[]]
    redirected = False
    for word in lexer:
        if word in {"|", "&&", ";", "||"}:
            found.append([])
            redirected = False
        elif word in {">", ">>"}:
            redirected = True
        elif not redirected:
            found[-1].append(word)
    return [words for words in found if words]


def commands() -> list[Command]:
    found = []
    for path in DOCS:
        for lang, body in blocks(path):
            if lang not in SHELL:
                continue
            for line in re.sub(r"\\\n\s*", " ", body).splitlines():
                for words in segments(line):
                    found.append(Command(str(path.relative_to(ROOT)), tuple(words)))
    return found


COMMANDS = commands()


def named_files() -> dict[str, str]:
    """The YAML files the docs introduce by name on their first line."""
    files = {}
    for path in DOCS:
        for lang, body in blocks(path):
            first = body.splitlines()[0] if body else ""
            if lang == "yaml" and (m := re.match(r"# ([\w.-]+\.yaml)\b", first)):
                files[m[1]] = body
    return files


def of(program: str, *subcommands: str) -> list[Command]:
    return [
        c
        for c in COMMANDS
        if c.argv[0] == program and (not subcommands or c.argv[1:2] in [(s,) for s in subcommands])
    ]


def option(argv: tuple[str, ...], *names: str) -> str | None:
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                return argv[i + 1]
            if word.startswith(f"{name}="):
                return word.split("=", 1)[1]
    return None


def options(argv: tuple[str, ...], *names: str) -> list[str]:
    found = []
    for i, word in enumerate(argv):
        if word in names and i + 1 < len(argv):
            found.append(argv[i + 1])
    return found


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A folder laid out like the repository's root, plus the files the docs make."""
    here = tmp_path_factory.mktemp("site")
    for name in ("helm-values", "jupyterhub_gpu", "images", "jupyterlab-gpu", "pyproject.toml"):
        (here / name).symlink_to(ROOT / name)
    for command in of("cp"):
        source, target = command.argv[1:]
        assert (ROOT / source).is_file(), f"{command}: {source} is not in the repository"
        shutil.copy(ROOT / source, here / target)
    for name, text in named_files().items():
        (here / name).write_text(text)
    return here


def test_the_docs_have_the_commands_this_test_runs():
    assert len(of("jupyterhub-gpu", *OFFLINE)) >= 20
    assert {c.doc for c in of("helm", "upgrade")} >= {"docs/deploy.md", "docs/quickstart.md"}
    assert "my-cluster.yaml" in {c.argv[2] for c in of("cp")}
    assert "site-secrets.yaml" in named_files()


@pytest.mark.parametrize("command", of("jupyterhub-gpu", *OFFLINE), ids=str)
def test_every_offline_command_in_the_docs_exits_0_as_printed(command, root):
    result = subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpu.cli", *command.argv[1:]],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    assert result.stdout


@pytest.mark.parametrize("command", of("jupyterhub-gpu", "manifests"), ids=str)
def test_every_manifests_command_binds_the_hub_in_jhub(command):
    assert option(command.argv, "--hub-namespace") == NAMESPACE, str(command)


@pytest.mark.parametrize(
    "command",
    [c for c in of("helm", "upgrade", "install") if "jupyterhub/jupyterhub" in c.argv],
    ids=str,
)
def test_every_helm_line_installs_the_release_in_jhub_with_values_the_chart_accepts(command, root):
    argv = command.argv
    assert option(argv, "--namespace", "-n") == NAMESPACE, str(command)
    if "--install" in argv or argv[1] == "install":
        assert "--create-namespace" in argv, str(command)
    assert argv[argv.index("jupyterhub/jupyterhub") - 1] == NAMESPACE  # the release's name
    assert option(argv, "--version") == "4.4.0"
    files = options(argv, "-f", "--values")
    assert files[0] == "helm-values/base.yaml", str(command)
    for name in files:
        assert (root / name).is_file(), f"{command}: {name} is named but never made"
    # what the chart would get: keys it accepts, and a policy the hub starts with
    assert z2jh_schema.unknown_keys(load_values([root / f for f in files])) == []
    result = subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpu.cli", "check", *files],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{command}\n{result.stderr}"


def test_other_helm_lines_name_the_release_and_its_namespace():
    for command in of("helm", "uninstall"):
        assert command.argv[2] == NAMESPACE, str(command)
        assert option(command.argv, "--namespace", "-n") == NAMESPACE, str(command)


def test_kubectl_lines_for_the_release_name_jhub():
    for command in of("kubectl", "create"):
        if command.argv[2] == "secret":
            assert option(command.argv, "-n", "--namespace") == NAMESPACE, str(command)
        if command.argv[2] == "namespace":
            assert command.argv[3] == NAMESPACE, str(command)
    for command in of("kubectl"):
        if any(word.startswith("deploy/hub") for word in command.argv):
            assert option(command.argv, "-n", "--namespace") == NAMESPACE, str(command)


def test_the_deploy_guide_creates_the_namespace_before_applying_the_manifests():
    # the RBAC's RoleBindings live in the release's namespace
    deploy = [c for c in COMMANDS if c.doc == "docs/deploy.md"]
    create = deploy.index(
        next(c for c in deploy if c.argv[:3] == ("kubectl", "create", "namespace"))
    )
    manifests = deploy.index(
        next(c for c in deploy if c.argv[:2] == ("jupyterhub-gpu", "manifests"))
    )
    helm = deploy.index(next(c for c in deploy if c.argv[:2] == ("helm", "upgrade")))
    assert create < manifests < helm


def test_the_pv_claims_the_docs_show_live_in_jhub():
    for path in DOCS:
        for lang, body in blocks(path):
            if lang != "yaml":
                continue
            for document in yaml.safe_load_all(body):
                if not isinstance(document, dict):
                    continue
                if document.get("kind") == "PersistentVolume" and "claimRef" in document["spec"]:
                    assert document["spec"]["claimRef"]["namespace"] == NAMESPACE
                if document.get("kind") == "PersistentVolumeClaim":
                    assert document["metadata"]["namespace"] == NAMESPACE


def dockerfile_args(path: Path) -> dict[str, str]:
    args = {}
    for line in path.read_text().splitlines():
        if m := re.match(r"ARG (\w+)(?:=(.*))?$", line):
            args[m[1]] = (m[2] or "").strip('"')
    return args


@pytest.mark.parametrize("command", of("docker", "build"), ids=str)
def test_every_docker_build_line_names_a_dockerfile_its_arguments_and_context(command):
    argv = command.argv
    dockerfile = ROOT / option(argv, "-f")
    assert dockerfile.is_file(), str(command)
    args = dockerfile_args(dockerfile)
    build_args = dict(a.split("=", 1) for a in options(argv, "--build-arg"))
    assert set(build_args) <= set(args), str(command)
    # the build context: what the Dockerfile copies is there
    assert argv[-1] == ".", str(command)
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert list(ROOT.glob(source)) or source.startswith("dist/"), (command, source)
    tag = option(argv, "-t")
    assert tag
    assert ":" in tag
    if dockerfile == ROOT / "images" / "hub" / "Dockerfile":
        chart = build_args.get("K8S_HUB_VERSION", args["K8S_HUB_VERSION"])
        assert tag.rpartition(":")[2] == f"{jupyterhub_gpu.__version__}-{chart}", str(command)
        base = yaml.safe_load((ROOT / "helm-values" / "base.yaml").read_text())["hub"]["image"]
        assert tag == f"{base['name']}:{base['tag']}", str(command)
        assert set(build_args.get("EXTRAS", "").split(",")) <= {"", "ldap", "oidc"}
    if "BASE_IMAGE" in build_args:
        assert not build_args["BASE_IMAGE"].endswith("latest"), str(command)


def profile_images(policy: dict) -> set[str]:
    """Every image a profile of ``policy`` (hub.config.GPUPolicy) runs, its image
    option's choices included."""
    images = set()
    for profile in (policy.get("profiles") or {}).values():
        if profile.get("image"):
            images.add(profile["image"])
        choices = ((profile.get("options") or {}).get("image") or {}).get("choices") or []
        images |= set(choices.values() if isinstance(choices, dict) else choices)
    return images


@pytest.mark.parametrize("example", ["university", "department", "enterprise"])
def test_every_recipe_image_is_a_single_user_image_the_docs_build_with_the_extension(example):
    """A recipe's profiles run only images the docs build from images/singleuser (each
    installs the JupyterLab extension, tests/test_hub_image.py) on a pinned base."""
    built = {
        option(c.argv, "-t")
        for c in of("docker", "build")
        if (option(c.argv, "-f") or "").startswith("images/singleuser/")
    }
    values = load_values([ROOT / "helm-values" / f"{example}.yaml"])
    images = profile_images(values["hub"]["config"]["GPUPolicy"])
    assert images
    assert images <= built, f"{example}: not built by the docs: {sorted(images - built)}"


def test_manifests_takes_the_namespace_from_the_values_or_asks_for_the_option(tmp_path):
    def manifests(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "jupyterhub_gpu.cli", "manifests", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    values = ["helm-values/base.yaml", "helm-values/university.yaml"]
    missing = manifests(*values)
    assert missing.returncode == 1
    assert missing.stdout == ""  # nothing bound to a guessed namespace
    assert "pass --hub-namespace NAMESPACE" in missing.stderr
    assert "hub.config.KubeSpawner.namespace" in missing.stderr

    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"hub": {"config": {"KubeSpawner": {"namespace": "gpu-hub"}}}}))
    from_values = manifests(*values, str(site))
    assert from_values.returncode == 0, from_values.stderr
    bindings = [
        d for d in yaml.safe_load_all(from_values.stdout) if d["kind"] == "ClusterRoleBinding"
    ]
    assert bindings
    assert {s["namespace"] for b in bindings for s in b["subjects"]} == {"gpu-hub"}
    # the option wins over the values
    given = manifests(*values, str(site), "--hub-namespace", NAMESPACE)
    subjects = {
        s["namespace"]
        for d in yaml.safe_load_all(given.stdout)
        if d["kind"] == "ClusterRoleBinding"
        for s in d["subjects"]
    }
    assert subjects == {NAMESPACE}


def deploy_lines(*starts: str) -> list[str]:
    """Whole shell lines of the deploy guide (pipes kept), those starting so."""
    found = []
    for lang, body in blocks(ROOT / "docs" / "deploy.md"):
        if lang in SHELL:
            for line in re.sub(r"\\\n\s*", " ", body).splitlines():
                if line.strip().startswith(starts):
                    found.append(line.strip())
    return found


def run_line(line: str, root: Path, kubeconfig: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", line],
        cwd=root,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def kubectl_json(kubeconfig: Path, *argv: str) -> dict:
    out = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *argv, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory):
    """A cluster of this module's own: the guide's objects have the names a real
    deployment's have (``jupyterhub-gpu-spawner``, the queues ``research``, ...), which
    other modules' hubs use in the session's cluster."""
    from jupyterhub_gpu.dev.localcluster.cluster import LocalCluster

    cluster = LocalCluster.create(
        name=f"pytest-docs-commands-{os.getpid()}",
        directory=tmp_path_factory.mktemp("docs-commands-cluster"),
    )
    yield cluster
    cluster.down()


@pytest.mark.k8s
async def test_the_deploy_guides_install_and_removal_lines_run_against_a_real_api_server(
    own_cluster, root
):
    """The guide's namespace, manifests and removal lines, as printed, on a local
    cluster: the RBAC binds the chart's service account where the chart installs it,
    and the removal leaves the namespace to delete by hand."""
    from jupyterhub_gpu.dev.localcluster import crds

    async with own_cluster.api() as api:
        await crds.install(api, "kai")  # the university's scheduler: its CRDs come first
    await asyncio.to_thread(install_and_remove, Path(own_cluster.state.kubeconfig), root)


def install_and_remove(kubeconfig: Path, root: Path) -> None:
    (create,) = deploy_lines("kubectl create namespace")
    install, upgrade = deploy_lines("jupyterhub-gpu manifests")[:2]
    (removal,) = [
        line for line in deploy_lines("jupyterhub-gpu manifests") if "--for-removal" in line
    ]
    assert install == upgrade  # the same line before an upgrade
    try:
        for line in (create, install):
            result = run_line(line, root, kubeconfig)
            assert result.returncode == 0, f"{line}\n{result.stderr}"
        bindings = kubectl_json(kubeconfig, "get", "rolebindings", "-n", NAMESPACE)["items"]
        subjects = {(s["kind"], s["name"], s["namespace"]) for b in bindings for s in b["subjects"]}
        # z2jh's hub account, in the release's namespace
        assert subjects == {("ServiceAccount", "hub", NAMESPACE)}
        queues = kubectl_json(kubeconfig, "get", "queues.scheduling.run.ai")["items"]
        assert {"research", "students", "test"} <= {q["metadata"]["name"] for q in queues}

        result = run_line(removal, root, kubeconfig)
        assert result.returncode == 0, f"{removal}\n{result.stderr}"
        left = kubectl_json(kubeconfig, "get", "clusterroles")["items"]
        assert not [r for r in left if r["metadata"]["name"].endswith(f"-{NAMESPACE}")]
        assert not kubectl_json(kubeconfig, "get", "rolebindings", "-n", NAMESPACE)["items"]
        # the namespace stays: deleting it is the admin's own step
        kubectl_json(kubeconfig, "get", "namespace", NAMESPACE)
    finally:
        subprocess.run(
            [
                "kubectl",
                "--kubeconfig",
                str(kubeconfig),
                "delete",
                "namespace",
                NAMESPACE,
                "--ignore-not-found",
                "--wait=false",
            ],
            capture_output=True,
            timeout=60,
        )
