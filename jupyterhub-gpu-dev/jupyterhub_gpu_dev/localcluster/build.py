"""Build (once) or find the local cluster's binaries.

Each component is built from a Go module of ours under ``gomod/`` that pins its
upstream version; the result is cached outside the repository under
``$JUPYTERHUB_GPU_CACHE`` (default ``~/.cache/jupyterhub-gpu``), keyed by the
component, its version and a hash of our go.mod/go.sum, and reused from then on.
``JUPYTERHUB_GPU_BIN_DIR`` (or ``--bin-dir``) names a folder of prebuilt
binaries to use instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

GOMOD = Path(__file__).parent / "gomod"

ProgressFn = Callable[[str], None]


@dataclass(frozen=True)
class Component:
    name: str
    upstream: str  # the module whose version is pinned
    binaries: tuple[str, ...]
    packages: tuple[str, ...]
    tags: str = ""
    #: the package whose gitVersion/gitMajor/gitMinor the binaries report (as upstream's
    #: release build stamps them); unstamped, kube-apiserver says v0.0.0-master, which
    #: clients that read the server version (Kueue) refuse
    version_package: str = ""

    @property
    def ldflags(self) -> str:
        flags = ["-s", "-w"]
        if self.version_package:
            major, minor = self.version.lstrip("v").split(".")[:2]
            for name, value in (
                ("gitVersion", self.version),
                ("gitMajor", major),
                ("gitMinor", minor),
                ("gitTreeState", "clean"),
            ):
                flags.append(f"-X {self.version_package}.{name}={value}")
        return " ".join(flags)

    @property
    def named_as_packages(self) -> bool:
        """True when each binary is named after its package's folder, as `go build` names it."""
        return [p.rsplit("/", 1)[-1] for p in self.packages] == list(self.binaries)

    @property
    def module_dir(self) -> Path:
        return GOMOD / self.name

    @property
    def version(self) -> str:
        """The pinned upstream version, read from our go.mod."""
        gomod = (self.module_dir / "go.mod").read_text()
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(self.upstream)}\s+(v\S+)", gomod, re.M)
        if not match:
            raise RuntimeError(f"{self.module_dir}/go.mod: no pinned version found")
        return match.group(1)

    @property
    def key(self) -> str:
        digest = hashlib.sha256()
        for f in sorted(self.module_dir.iterdir()):
            if f.suffix in (".mod", ".sum", ".go"):
                digest.update(f.name.encode() + f.read_bytes())
        if self.version_package:  # binaries built before they were stamped are rebuilt
            digest.update(self.ldflags.encode())
        return f"{self.name}-{self.version}-{digest.hexdigest()[:12]}"


COMPONENTS = (
    Component("etcd", "go.etcd.io/etcd/server/v3", ("etcd",), (".",)),
    Component(
        "kubernetes",
        "k8s.io/kubernetes",
        ("kube-apiserver", "kube-controller-manager", "kube-scheduler"),
        (
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
        ),
        tags="selinux,notest",
        version_package="k8s.io/component-base/version",
    ),
    Component("kwok", "sigs.k8s.io/kwok", ("kwok",), ("sigs.k8s.io/kwok/cmd/kwok",)),
)
ALL_BINARIES = tuple(b for c in COMPONENTS for b in c.binaries)

# Schedulers the local cluster can run besides kube-scheduler, each built only
# when a cluster asks for it (`cluster build --scheduler kueue`): the plain
# control plane never waits for them.
SCHEDULER_COMPONENTS = {
    "kueue": Component("kueue", "sigs.k8s.io/kueue", ("kueue",), ("sigs.k8s.io/kueue/cmd/kueue",)),
    "volcano": Component(
        "volcano",
        "volcano.sh/volcano",
        ("vc-scheduler", "vc-controller-manager"),
        ("volcano.sh/volcano/cmd/scheduler", "volcano.sh/volcano/cmd/controller-manager"),
    ),
}


def cache_dir() -> Path:
    base = os.environ.get("JUPYTERHUB_GPU_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "jupyterhub-gpu"
    )
    return Path(base)


def scheduler_components(schedulers: tuple[str, ...] | list[str] = ()) -> tuple[Component, ...]:
    """The components of the schedulers named, in the order given."""
    unknown = [name for name in schedulers if name not in SCHEDULER_COMPONENTS]
    if unknown:
        raise BuildError(
            f"no scheduler {', '.join(unknown)} for the local cluster: "
            f"choose from {', '.join(SCHEDULER_COMPONENTS)}"
        )
    return tuple(SCHEDULER_COMPONENTS[name] for name in dict.fromkeys(schedulers))


def versions(schedulers: tuple[str, ...] | list[str] = ()) -> dict[str, str]:
    return {c.name: c.version for c in (*COMPONENTS, *scheduler_components(schedulers))}


class BuildError(RuntimeError):
    pass


def _go() -> str:
    go = shutil.which("go")
    if not go:
        raise BuildError(
            "the local cluster is built from source with Go, and `go` is not on PATH: "
            "install Go >= 1.26, or pass --bin-dir / JUPYTERHUB_GPU_BIN_DIR with prebuilt "
            f"{', '.join(ALL_BINARIES)}"
        )
    return go


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # as upstream builds its release binaries; never let go fetch another toolchain
    env.update(CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-mod=readonly -buildvcs=false")
    return env


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _count_packages(component: Component) -> int:
    out = subprocess.run(
        [_go(), "list", "-deps", "-tags", component.tags, *component.packages],
        cwd=component.module_dir,
        env=_go_env(),
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise BuildError(f"go list for {component.name} failed:\n{out.stderr[-4000:]}")
    return len(out.stdout.split())


def _build(component: Component, dest: Path, progress: ProgressFn) -> None:
    progress(f"{component.name} {component.version}: resolving modules (first time only)")
    total = _count_packages(component)
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    cmd = [_go(), "build", "-v", "-trimpath", "-ldflags", component.ldflags]
    if component.tags:
        cmd += ["-tags", component.tags]
    if component.named_as_packages:
        commands = [[*cmd, "-o", str(staging) + "/", *component.packages]]
    else:
        # each binary named, not after its package's folder (our own `.`, Volcano's `scheduler`)
        commands = [
            [*cmd, "-o", str(staging / binary), package]
            for binary, package in zip(component.binaries, component.packages, strict=True)
        ]
    started = time.monotonic()
    compiled = 0
    last_report = 0.0
    for command in commands:
        proc = subprocess.Popen(
            command,
            cwd=component.module_dir,
            env=_go_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        tail: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail = [*tail[-40:], line]
            # `go build -v` names each package as it compiles it
            if line and " " not in line:
                compiled += 1
                now = time.monotonic()
                if now - last_report >= 5:
                    last_report = now
                    progress(
                        f"{component.name} {component.version}: compiled {compiled}/{total} "
                        f"packages ({int(now - started)}s) {line}"
                    )
        if proc.wait() != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise BuildError(f"building {component.name} failed:\n" + "\n".join(tail))
    staging.rename(dest)
    progress(f"{component.name} {component.version}: built in {int(time.monotonic() - started)}s")


def _print_progress(message: str) -> None:
    print(f"[jupyterhub-gpu build] {message}", file=sys.stderr, flush=True)


def ensure_binaries(
    bin_dir: str | os.PathLike | None = None,
    progress: ProgressFn | None = None,
    schedulers: tuple[str, ...] | list[str] = (),
) -> Path:
    """A folder holding every binary the local cluster needs, building what is missing.

    ``schedulers`` names the schedulers besides kube-scheduler to build as well
    (``"kueue"``); the control plane alone is built when it is empty.
    With ``bin_dir`` (or ``JUPYTERHUB_GPU_BIN_DIR``) that folder is used as is and
    nothing is built: a missing binary there is an error naming it.
    """
    progress = progress or _print_progress
    components = (*COMPONENTS, *scheduler_components(schedulers))
    given = bin_dir or os.environ.get("JUPYTERHUB_GPU_BIN_DIR")
    if given:
        folder = Path(given).expanduser().resolve()
        wanted = [b for c in components for b in c.binaries]
        missing = [b for b in wanted if not os.access(folder / b, os.X_OK)]
        if missing:
            raise BuildError(
                f"--bin-dir {folder}: no executable {', '.join(missing)} there; "
                "put prebuilt binaries there or leave --bin-dir unset to build them"
            )
        return folder

    root = cache_dir() / "bin"
    with _lock(root / ".lock"):
        folders = []
        for component in components:
            dest = root / component.key
            if not all((dest / b).exists() for b in component.binaries):
                shutil.rmtree(dest, ignore_errors=True)
                _build(component, dest, progress)
            folders.append(dest)
        # one folder of links, so every caller sees a single --bin-dir-like layout; named
        # after the builds it links, so checkouts pinning other versions (or asking for
        # other schedulers) never swap a running caller's binaries under it
        keys = ",".join(component.key for component in components)
        links = root / f"active-{hashlib.sha256(keys.encode()).hexdigest()[:12]}"
        links.mkdir(exist_ok=True)
        for component, folder in zip(components, folders, strict=True):
            for binary in component.binaries:
                link = links / binary
                if link.is_symlink() or link.exists():
                    if os.readlink(link) == str(folder / binary):
                        continue
                    link.unlink()
                link.symlink_to(folder / binary)
    return links
