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
the chart's, as in ``helm-values/base.yaml``. And a newcomer follows the deploy guide in
order on a local cluster: its namespace and manifests lines against the real API
server, a hub started from the values files its ``helm`` line names (in ``jhub``, as
the chart's service account), its first login, and its removal lines.
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


def run_as_printed(command: Command, root: Path) -> str:
    """What a docs ``jupyterhub-gpu`` command prints, run in ``root``; it must exit 0."""
    result = subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpu.cli", *command.argv[1:]],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    return result.stdout


@pytest.mark.parametrize("command", of("jupyterhub-gpu", *OFFLINE), ids=str)
def test_every_offline_command_in_the_docs_exits_0_as_printed(command, root):
    assert run_as_printed(command, root)


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


def test_every_values_block_the_docs_show_has_keys_the_chart_accepts():
    """The chart values a page shows (TLS, secrets, the usage database), as a site
    copies them into its own file."""
    shown = 0
    for path in DOCS:
        for lang, body in blocks(path):
            if lang != "yaml":
                continue
            for document in yaml.safe_load_all(body):
                chart = {"hub", "proxy", "singleuser", "ingress", "scheduling"}
                if isinstance(document, dict) and set(document) & chart:
                    assert z2jh_schema.unknown_keys(document) == [], (path.name, document)
                    shown += 1
    assert shown >= 4


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
def own_cluster(tmp_path_factory, built):
    """A cluster of this module's own: the guide's objects have the names a real
    deployment's have (``jupyterhub-gpu-spawner``, the queues ``research``, ...), which
    other modules' hubs use in the session's cluster. Its nodes are those the demo
    derives from the university recipe's flavors, and kube-scheduler stands in for KAI."""
    from jupyterhub_gpu_dev.demo import plan_demo
    from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster

    plan = plan_demo([str(ROOT / "helm-values" / "university.yaml")])
    cluster = LocalCluster.create(
        name=f"pytest-docs-commands-{os.getpid()}",
        directory=tmp_path_factory.mktemp("docs-commands-cluster"),
        node_pools=plan.node_pools,
        stand_in_schedulers=plan.stand_ins,
    )
    yield cluster
    cluster.down()


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_newcomer_following_the_deploy_guide_in_order_gets_a_working_hub_in_jhub(
    own_cluster, root
):
    """The guide's lines, as printed and in order, on a local cluster: the namespace and
    the manifests applied to the real API server (the RBAC binds the chart's service
    account where the chart installs it); then, for the ``helm`` line (no Helm or chart
    here), a hub started from exactly the values files that line names, in ``jhub``,
    as that service account; a member's first login is offered what ``profiles``
    printed and gets the pod ``pod`` printed; and the removal leaves the namespace to
    delete by hand."""
    from jupyterhub_gpu_dev.localcluster import crds

    kubeconfig = Path(own_cluster.state.kubeconfig)
    async with own_cluster.api() as api:
        await crds.install(api, "kai")  # the university's scheduler: its CRDs come first
    try:
        await asyncio.to_thread(install, kubeconfig, root)
        await first_login(own_cluster, root)
        await asyncio.to_thread(remove, kubeconfig, root)
    finally:
        await asyncio.to_thread(delete_namespace, kubeconfig)


def install(kubeconfig: Path, root: Path) -> None:
    """The guide's *Secrets* and *Install* lines before ``helm``: the namespace, then
    the manifests."""
    (create,) = deploy_lines("kubectl create namespace")
    install_line, upgrade = deploy_lines("jupyterhub-gpu manifests")[:2]
    assert install_line == upgrade  # the same line before an upgrade
    for line in (create, install_line):
        result = run_line(line, root, kubeconfig)
        assert result.returncode == 0, f"{line}\n{result.stderr}"
    bindings = kubectl_json(kubeconfig, "get", "rolebindings", "-n", NAMESPACE)["items"]
    subjects = {(s["kind"], s["name"], s["namespace"]) for b in bindings for s in b["subjects"]}
    # z2jh's hub account, in the release's namespace
    assert subjects == {("ServiceAccount", "hub", NAMESPACE)}
    queues = kubectl_json(kubeconfig, "get", "queues.scheduling.run.ai")["items"]
    assert {"research", "students", "test"} <= {q["metadata"]["name"] for q in queues}


def helm_values(root: Path) -> list[str]:
    """The values files the guide's ``helm upgrade --install`` line names, in order."""
    (line,) = [
        c for c in of("helm", "upgrade") if c.doc == "docs/deploy.md" and "--install" in c.argv
    ]
    return [str(root / name) for name in options(line.argv, "-f", "--values")]


async def first_login(cluster, root: Path) -> None:
    """What ``helm`` would run, from the values its line names: the chart's hub account
    and Role in ``jhub`` and a hub with those values' ``hub.config`` laid out as z2jh
    does (the demo's login in place of the university's directory, which is not here),
    its GPU service beside it; then the guide's *First login*."""
    from kubernetes_asyncio import client
    from rbac_helpers import apply_rendered_rbac, token_kubeconfig

    from hub_helpers import api, logged_in_opener, page_as
    from jupyterhub_gpu_dev.demo import plan_demo, stand_in_objects
    from jupyterhub_gpu_dev.localcluster.hub import LocalHub
    from kube_helpers import eventually

    plan = plan_demo(helm_values(root))
    async with cluster.api() as kube:
        core = client.CoreV1Api(kube)
        # the chart's part: its hub service account and Role, in the release's namespace
        await apply_rendered_rbac(kube, None, NAMESPACE, create_hub_namespace=False)
        # the prerequisites the guide names: the scheduler's own PriorityClasses (KAI's)
        # and the recipe's claims of the research data, in jhub as its YAML says
        create = {
            "PriorityClass": client.SchedulingV1Api(kube).create_priority_class,
            "RuntimeClass": client.NodeV1Api(kube).create_runtime_class,
        }
        for obj in stand_in_objects(plan.policy):
            await create[obj["kind"]](obj)
        for document in recipe_claims("university"):
            if document["kind"] == "PersistentVolume":
                await core.create_persistent_volume(document)
            else:
                await core.create_namespaced_persistent_volume_claim(NAMESPACE, document)
        directory = Path(cluster.state.path) / "newcomer"
        directory.mkdir()
        account = await token_kubeconfig(
            kube, Path(cluster.state.kubeconfig), NAMESPACE, "hub", directory / "hub.kubeconfig"
        )
        # the site's Prometheus is not here (loopback only): the idle rule falls back
        service = {k: v for k, v in plan.service_settings.items() if k != "prometheus_url"}
        hub = LocalHub(
            cluster,
            namespace=NAMESPACE,
            users={"rita": ["research"]},
            policy=plan.policy_values,
            hub_config=plan.hub_config,
            service_settings=service,
            z2jh_layout=True,
            gpu_service=True,
            kubeconfig=account,
            service_kubeconfig=account,
        )
        try:
            await asyncio.to_thread(hub.start, 120)
            # 2. a member logs in: the spawn form offers what `profiles` printed
            profiles = run_doc_command(root, "profiles", "--groups research")
            page = await asyncio.to_thread(page_as, hub.url, "rita", hub.password)
            offered = re.findall(r'name="profile"[^>]*value="([^"]+)"', page)
            printed = re.findall(r"^(\S+--\S+):", profiles, re.M)
            assert offered, page
            assert offered == printed, profiles
            # 3. a server: its pod is the one `pod` printed, in jhub
            printed_pod = yaml.safe_load(run_doc_command(root, "pod", "--user rita"))
            options = {"profile": "research--research", "gpus": "2"}
            status, body = await asyncio.to_thread(
                hub.api, "POST", "/users/rita/server", options, None, 120
            )
            assert status in (201, 202), body

            async def ready():
                _, model = await api(hub, "GET", "/users/rita")
                return bool(model["servers"].get("") and model["servers"][""]["ready"])

            await eventually(ready, "rita's server to be ready", within=180)
            (pod,) = (
                await core.list_namespaced_pod(
                    NAMESPACE, label_selector="hub.jupyter.org/username=rita"
                )
            ).items
            pod = kube.sanitize_for_serialization(pod)
            container, printed_container = (
                pod["spec"]["containers"][0],
                printed_pod["spec"]["containers"][0],
            )
            assert amounts(container["resources"]) == amounts(printed_container["resources"])
            assert container["image"] == printed_container["image"]
            for key in ("nodeSelector", "schedulerName", "priorityClassName"):
                assert pod["spec"].get(key) == printed_pod["spec"].get(key), key
            # the policy's labels, the release's namespace (--hub-namespace) among them
            assert printed_pod["metadata"]["namespace"] == NAMESPACE
            ours = {
                k: v
                for k, v in printed_pod["metadata"]["labels"].items()
                if k.startswith("gpu.jupyterhub.org/")
            }
            assert ours["gpu.jupyterhub.org/hub"] == NAMESPACE
            assert ours.items() <= pod["metadata"]["labels"].items()
            # 4. the dashboard's usage, as rita's browser reads it: her group
            session = await asyncio.to_thread(logged_in_opener, hub.url, "rita", hub.password)

            async def usage():
                with await asyncio.to_thread(session.open, hub.service_url, timeout=60):
                    pass
                response = await asyncio.to_thread(
                    session.open, hub.service_url + "api/usage", timeout=30
                )
                view = json.loads(response.read())
                return [g["name"] for g in view["groups"]]

            groups = await eventually(usage, "the dashboard's usage", within=90)
            assert "research" in groups
        finally:
            await asyncio.to_thread(hub.stop)


def amounts(resources: dict) -> dict:
    """A pod's requests and limits as numbers (``8``, ``8.0`` and ``"8"`` alike)."""
    from jupyterhub_gpu.core.quantities import parse_quantity

    return {
        kind: {name: parse_quantity(str(value)) for name, value in values.items()}
        for kind, values in resources.items()
    }


def run_doc_command(root: Path, subcommand: str, marker: str) -> str:
    """The output of the guide's ``jupyterhub-gpu SUBCOMMAND`` line that has ``marker``."""
    (command,) = [
        c
        for c in of("jupyterhub-gpu", subcommand)
        if c.doc == "docs/deploy.md" and marker in shlex.join(c.argv)
    ]
    return run_as_printed(command, root)


def recipe_claims(recipe: str) -> list[dict]:
    """The PersistentVolumes and claims a recipe's YAML blocks show, with the other
    claims it says to make "the same" way (research-training beside research-datasets)."""
    found = []
    for lang, body in blocks(ROOT / "docs" / "recipes" / f"{recipe}.md"):
        if lang == "yaml":
            found += [
                d
                for d in yaml.safe_load_all(body)
                if isinstance(d, dict)
                and d.get("kind") in ("PersistentVolume", "PersistentVolumeClaim")
            ]
    from jupyterhub_gpu.config.values import policy_from_values

    policy = policy_from_values([ROOT / "helm-values" / f"{recipe}.yaml"])
    claims = {d.claim for d in policy.datasets.values() if d.claim}
    shown = {d["metadata"]["name"] for d in found if d["kind"] == "PersistentVolumeClaim"}
    for name in sorted(claims - shown):
        for document in [d for d in found if d["metadata"]["name"] in shown]:
            copy = json.loads(json.dumps(document).replace(document["metadata"]["name"], name))
            found.append(copy)
    return found


def remove(kubeconfig: Path, root: Path) -> None:
    """The guide's removal: what the chart made goes (for ``helm uninstall``), then the
    bundle's RBAC with the guide's line; the namespace stays."""
    for kind in ("rolebinding", "role", "serviceaccount"):
        subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), "delete", kind, "hub", "-n", NAMESPACE],
            capture_output=True,
            timeout=60,
            check=True,
        )
    (removal,) = [
        line for line in deploy_lines("jupyterhub-gpu manifests") if "--for-removal" in line
    ]
    result = run_line(removal, root, kubeconfig)
    assert result.returncode == 0, f"{removal}\n{result.stderr}"
    left = kubectl_json(kubeconfig, "get", "clusterroles")["items"]
    assert not [r for r in left if r["metadata"]["name"].endswith(f"-{NAMESPACE}")]
    assert not kubectl_json(kubeconfig, "get", "rolebindings", "-n", NAMESPACE)["items"]
    # the namespace stays: deleting it is the admin's own step
    kubectl_json(kubeconfig, "get", "namespace", NAMESPACE)


def delete_namespace(kubeconfig: Path) -> None:
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
