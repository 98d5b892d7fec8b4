"""code-server, installed once for the demo's VS Code, cached by its lockfile's hash.

The demo's servers run on this machine (the pod runner), so the VS Code that a
VS Code image would carry (``images/singleuser/Dockerfile.vscode``) is installed
here: code-server from npm, the newest release that runs on Node.js 20, with
its whole tree pinned in ``codeserver/package-lock.json``. ``npm ci`` installs it
into ``$JUPYTERHUB_GPU_CACHE/node/code-server-<hash>`` (default
``~/.cache/jupyterhub-gpu``); ``bin/code-server`` there is its only command, so
putting that folder on a server's PATH adds nothing else.

Installing it builds native modules (kerberos, node-pty, spdlog, argon2, ...)
with the system's C++ compiler against Node.js's own headers, and never
downloads from GitHub: every prebuilt-binary download is switched off (they
are built from source instead), and the ripgrep that VS Code's search runs is
Debian's, handed to ``@vscode/ripgrep``'s install through the download cache
it looks in first (a folder of ours given to npm as ``TMPDIR``). Needs: Node.js
20 with npm, ``g++`` and ``make``, the Kerberos headers (``libkrb5-dev``) and
``rg`` (``ripgrep``); a missing one is named with the package to install.

``offline_setup`` writes what an image configured for offline use would carry:
code-server's config (loopback only, no password: the Jupyter server's login
guards ``/vscode/``; no telemetry, update check or workspace trust prompt) and
VS Code settings that keep it from reaching out, with ``EXTENSIONS_GALLERY``
naming no marketplace.

``python -m jupyterhub_gpu_dev.codeserver`` installs it (if needed) and prints
the folder holding ``code-server``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .localcluster import build

#: the committed package.json and package-lock.json that pin the tree
SOURCE = Path(__file__).with_name("codeserver")
FILES = ("package.json", "package-lock.json")
#: ``@vscode/ripgrep``'s version in code-server's VS Code and the ripgrep release it
#: fetches (its lib/postinstall.js): the name of the cached download it looks for
RIPGREP_PACKAGE = "1.15.11"
RIPGREP_RELEASE = "v13.0.0-10"
_RIPGREP_TARGETS = {"x86_64": "x86_64-unknown-linux-musl", "aarch64": "aarch64-unknown-linux-musl"}
#: the Node.js major code-server's install accepts (its postinstall.sh refuses others)
NODE_MAJOR = 20
#: how often a running install says it is still going
PROGRESS_EVERY = 15.0

ProgressFn = Callable[[str], None]


def version() -> str:
    """The pinned code-server version (package.json)."""
    return json.loads((SOURCE / "package.json").read_text())["dependencies"]["code-server"]


def _key() -> str:
    digest = hashlib.sha256()
    for name in FILES:
        digest.update(name.encode() + b"\0" + (SOURCE / name).read_bytes())
    digest.update(platform.machine().encode())  # native modules are built for it
    return digest.hexdigest()[:12]


def install_dir() -> Path:
    """Where this tree is (or would be) installed."""
    return build.cache_dir() / "node" / f"code-server-{_key()}"


def installed_bin_dir() -> Path | None:
    """The folder holding ``code-server`` when it is installed, else None; installs
    nothing (the pod runner asks this at each server's start)."""
    folder = install_dir() / "bin"
    return folder if (folder / "code-server").is_file() else None


def _say(text: str) -> None:
    print(f"[jupyterhub-gpu code-server] {text}", file=sys.stderr, flush=True)


def _node() -> tuple[str, str]:
    """(node, npm), or BuildError naming what to install."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise build.BuildError(
            f"code-server is installed with npm and runs on Node.js {NODE_MAJOR}, and "
            f"`{'node' if not node else 'npm'}` is not on PATH: install Node.js {NODE_MAJOR} "
            "with npm (for example NodeSource's nodejs 20.x package)"
        )
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    found = out.stdout.strip()
    if not re.match(rf"v{NODE_MAJOR}\.", found):
        raise build.BuildError(
            f"code-server {version()} needs Node.js {NODE_MAJOR}, and {node} is {found}: "
            f"put a Node.js {NODE_MAJOR} first on PATH (code-server's install refuses others)"
        )
    return node, npm


def missing_prerequisites() -> list[str]:
    """What the install needs and this machine lacks, each with how to get it."""
    missing = []
    for command, package in (("g++", "g++"), ("make", "make"), ("rg", "ripgrep")):
        if not shutil.which(command):
            missing.append(f"`{command}` (apt-get install {package})")
    if not Path("/usr/include/gssapi/gssapi.h").exists():
        missing.append("the Kerberos headers for its kerberos module (apt-get install libkrb5-dev)")
    if platform.machine() not in _RIPGREP_TARGETS:
        missing.append(f"a supported machine (x86_64 or aarch64, not {platform.machine()})")
    return missing


#: the Debian packages behind ``missing_prerequisites``' commands and headers
_PACKAGES = {"g++": "g++", "make": "make", "rg": "ripgrep"}


def install_missing_packages(say: ProgressFn) -> None:
    """As root on a Debian machine, apt-get the packages the install lacks (as the
    test command does for its own), so a newcomer's first demo needs no manual step;
    elsewhere nothing happens, and the install names what to get."""
    packages = [p for command, p in _PACKAGES.items() if not shutil.which(command)]
    if not Path("/usr/include/gssapi/gssapi.h").exists():
        packages.append("libkrb5-dev")
    if not packages or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    say(f"installing Debian's {', '.join(packages)} for code-server's build")
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, capture_output=True, env=env).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env)
        result = subprocess.run(install, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise build.BuildError(
                f"apt-get install {' '.join(packages)} failed: {result.stderr.strip()[-300:]}"
            )


def _node_headers(node: str) -> Path | None:
    """The Node.js installation whose ``include/node`` node-gyp builds against (so it
    never downloads headers), when the headers are there."""
    prefix = Path(node).resolve().parent.parent
    return prefix if (prefix / "include" / "node" / "node.h").exists() else None


def _seed_ripgrep(tmp: Path) -> None:
    """Put Debian's rg where ``@vscode/ripgrep``'s install looks for a cached download
    (``$TMPDIR/vscode-ripgrep-cache-<version>/ripgrep-<release>-<target>.tar.gz``)."""
    rg = shutil.which("rg")
    assert rg is not None  # missing_prerequisites said so otherwise
    cache = tmp / f"vscode-ripgrep-cache-{RIPGREP_PACKAGE}"
    cache.mkdir(parents=True, exist_ok=True)
    target = _RIPGREP_TARGETS[platform.machine()]
    archive = cache / f"ripgrep-{RIPGREP_RELEASE}-{target}.tar.gz"
    staged = archive.with_suffix(".partial")
    with tarfile.open(staged, "w:gz") as tar:
        tar.add(Path(rg).resolve(), arcname="rg")
    staged.rename(archive)


def _npm_env(tmp: Path, node: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TMPDIR=str(tmp),
        # as root, code-server's postinstall exits unless npm runs scripts unsafe-perm
        npm_config_unsafe_perm="true",
        # node-pty's install runs `npx node-gyp`, which without a terminal to ask would
        # cancel instead of fetching node-gyp from the registry
        npm_config_yes="true",
        # prebuild-install and node-pre-gyp would fetch prebuilt modules from GitHub:
        # build them here instead, as code-server's own docs for npm installs expect
        npm_config_build_from_source="true",
        npm_config_audit="false",
        npm_config_fund="false",
        npm_config_update_notifier="false",
    )
    headers = _node_headers(node)
    if headers:
        env["npm_config_nodedir"] = str(headers)
    return env


def _run_npm_ci(npm: str, prefix: Path, env: dict[str, str], say: ProgressFn) -> None:
    log_path = prefix.parent / f"{prefix.name}.log"
    started = time.monotonic()
    done = threading.Event()

    def report() -> None:
        while not done.wait(PROGRESS_EVERY):
            say(
                f"still installing code-server {version()} "
                f"({time.monotonic() - started:.0f}s; its log: {log_path})"
            )

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        with open(log_path, "w") as log:
            result = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund"],
                cwd=prefix,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    finally:
        done.set()
        reporter.join()
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise build.BuildError(
            f"installing code-server {version()} with npm ci failed (exit "
            f"{result.returncode}) in {prefix}; the end of its log ({log_path}):\n{tail}\n"
            "It builds native modules: it needs g++, make, Python 3, the Kerberos headers "
            "(libkrb5-dev) and Node.js's headers (include/node beside node)"
        )


def _write_launcher(prefix: Path, node: str) -> Path:
    """``bin/code-server``: code-server on the Node.js its native modules were built
    for, whatever other node a server's PATH finds first."""
    entry = prefix / "node_modules" / "code-server" / "out" / "node" / "entry.js"
    if not entry.is_file():
        raise build.BuildError(f"npm ci finished but {entry} is missing: remove {prefix} and retry")
    folder = prefix / "bin"
    folder.mkdir(exist_ok=True)
    launcher = folder / "code-server"
    staged = launcher.with_suffix(".partial")
    staged.write_text(f'#!/bin/sh\nexec "{Path(node).resolve()}" "{entry}" "$@"\n')
    staged.chmod(0o755)
    with tempfile.TemporaryDirectory() as scratch:
        # code-server writes a default config wherever it looks for one: not the user's
        env = {**os.environ, "XDG_CONFIG_HOME": scratch, "XDG_DATA_HOME": scratch}
        out = subprocess.run([str(staged), "--version"], capture_output=True, text=True, env=env)
    if out.returncode != 0 or not re.search(rf"^{re.escape(version())} ", out.stdout, re.M):
        raise build.BuildError(
            f"the installed code-server does not run ({staged} --version exited "
            f"{out.returncode}):\n{(out.stdout + out.stderr)[-2000:]}\nremove {prefix} and retry"
        )
    staged.rename(launcher)  # last: its presence says the install is whole
    return folder


def ensure_code_server(progress: ProgressFn | None = None) -> Path:
    """The folder holding ``code-server``, installing it first when it is not yet
    (about a minute, once; then it is found in the cache)."""
    found = installed_bin_dir()
    if found:
        return found
    say = progress or _say
    prefix = install_dir()
    # two test workers, or a test session and the demo, may both find it missing
    with build._lock(prefix.parent / f"{prefix.name}.lock"):
        found = installed_bin_dir()
        if found:
            return found
        node, npm = _node()
        missing = missing_prerequisites()
        if missing:
            raise build.BuildError(
                f"code-server {version()} cannot be installed here; missing: " + "; ".join(missing)
            )
        say(
            f"installing code-server {version()} with npm ci (once; about a minute, building "
            f"its native modules), the tree pinned in {SOURCE / 'package-lock.json'}"
        )
        started = time.monotonic()
        shutil.rmtree(prefix, ignore_errors=True)  # what an interrupted install left
        prefix.mkdir(parents=True)
        for name in FILES:
            shutil.copyfile(SOURCE / name, prefix / name)
        tmp = prefix.parent / "code-server-tmp"
        _seed_ripgrep(tmp)
        _run_npm_ci(npm, prefix, _npm_env(tmp, node), say)
        folder = _write_launcher(prefix, node)
        say(f"installed code-server {version()} in {time.monotonic() - started:.0f}s: {folder}")
        return folder


# ---- what an image configured for offline use carries -------------------------------

#: code-server's config: loopback only (jupyter-vscode-proxy passes the port, no host),
#: no password of its own, nothing that reaches out or prompts
CONFIG = {
    "bind-addr": "127.0.0.1:8080",
    "auth": "none",
    "cert": False,
    "disable-telemetry": True,
    "disable-update-check": True,
    "disable-workspace-trust": True,
}
#: VS Code's user settings that keep it from reaching out or asking on first start
SETTINGS = {
    "update.mode": "none",
    "telemetry.telemetryLevel": "off",
    "extensions.autoCheckUpdates": False,
    "extensions.autoUpdate": False,
    "workbench.enableExperiments": False,
    "workbench.startupEditor": "none",
    "security.workspace.trust.enabled": False,
    "npm.fetchOnlinePackageInfo": False,
    "typescript.disableAutomaticTypeAcquisition": True,
}


def offline_setup(home: Path) -> dict[str, str]:
    """Write code-server's config and VS Code's settings into ``home`` (a server's);
    the environment variables that go with them. The config is rewritten at every
    start (it is the image's); settings a user changed are kept, and only the keys
    they lack are added."""
    data = home / ".local" / "share" / "code-server"
    config_path = home / ".config" / "code-server" / "config.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config = {
        **CONFIG,
        "user-data-dir": str(data),
        "extensions-dir": str(data / "extensions"),
    }
    # YAML's flow style is JSON: one value a line, as code-server's own config reads
    config_path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))
    settings_path = data / "User" / "settings.json"
    settings_path.parent.mkdir(parents=True, exist_ok=True)
    settings: dict = {}
    if settings_path.exists():
        try:
            settings = json.loads(settings_path.read_text())
        except ValueError:
            # VS Code writes JSON with comments: a file that is not plain JSON is one the
            # user edited, left as it is
            return _env(config_path)
    settings_path.write_text(json.dumps({**SETTINGS, **settings}, indent=2) + "\n")
    return _env(config_path)


def _env(config_path: Path) -> dict[str, str]:
    # an empty gallery: no marketplace to query for extensions or recommendations
    return {"CODE_SERVER_CONFIG": str(config_path), "EXTENSIONS_GALLERY": "{}"}


if __name__ == "__main__":
    try:
        print(ensure_code_server())
    except build.BuildError as error:
        print(f"jupyterhub-gpu code-server: {error}", file=sys.stderr)
        sys.exit(1)
