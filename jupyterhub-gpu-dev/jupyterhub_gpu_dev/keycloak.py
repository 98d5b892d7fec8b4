"""A throwaway Keycloak (an OIDC provider) on 127.0.0.1, from Maven Central's distribution.

For the tests of OIDC logins with groups (``jupyterhub_gpu.auth.oidc``): Keycloak's
distribution (``org.keycloak:keycloak-quarkus-dist``, a zip) is downloaded once
into ``$JUPYTERHUB_GPU_CACHE/keycloak/VERSION`` (default ``~/.cache/jupyterhub-gpu``),
checked against the SHA-1 Maven Central publishes beside it, and unpacked there.
Each ``LocalKeycloak`` runs ``kc.sh start-dev`` from a small home of its own
(the launcher, configuration and build output copied; the libraries linked), so
the cached distribution is never written to, with an in-memory database, HTTP
on a free loopback port and nothing else listening beyond loopback. Realms are
created through the admin REST API.

    with LocalKeycloak() as keycloak:
        keycloak.create_realm({"realm": "example", ...})
        keycloak.add_to_group("example", "alice", "/research/nlp")

``python -m jupyterhub_gpu_dev.keycloak`` downloads the distribution (with
progress) and prints its folder, for a test machine's set-up.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .localcluster.build import cache_dir
from .localcluster.cluster import free_port

#: the release the tests run (it runs on Debian 12's Java 17, which java_home() checks)
VERSION = "26.5.6"
MAVEN = "https://repo1.maven.org/maven2/org/keycloak/keycloak-quarkus-dist"
#: the Java release the distribution needs at least
JAVA_RELEASE = 17
ADMIN = "admin"
ProgressFn = Callable[[str], None]


class KeycloakMissing(RuntimeError):
    """Keycloak's distribution cannot be had, or no Java runs it."""


def _say(message: str) -> None:
    print(f"[jupyterhub-gpu keycloak] {message}", file=sys.stderr, flush=True)


def _fetch_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read().decode().strip()


def _download(url: str, dest: Path, progress: ProgressFn) -> None:
    """``url`` to ``dest``, saying how far it is every 10%."""
    with urllib.request.urlopen(url, timeout=60) as r, open(dest, "wb") as out:
        total = int(r.headers.get("Content-Length") or 0)
        done = 0
        said = -1
        while chunk := r.read(1 << 20):
            out.write(chunk)
            done += len(chunk)
            if total and done * 10 // total > said:
                said = done * 10 // total
                progress(f"downloading {url.rsplit('/', 1)[1]}: {done >> 20} of {total >> 20} MiB")


def distribution(version: str = VERSION, progress: ProgressFn | None = None) -> Path:
    """The unpacked distribution of ``version`` in the cache, downloaded (and its SHA-1
    checked) the first time; one process does it while any other waits for it."""
    progress = progress or _say
    root = cache_dir() / "keycloak" / version
    home = root / f"keycloak-{version}"
    if (home / "bin" / "kc.sh").exists():
        return home
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be fetching it now
        if (home / "bin" / "kc.sh").exists():
            return home
        name = f"keycloak-quarkus-dist-{version}.zip"
        url = f"{MAVEN}/{version}/{name}"
        archive = root / name
        started = time.monotonic()
        try:
            expected = _fetch_text(f"{url}.sha1").split()[0].lower()
            if not archive.exists() or _sha1(archive) != expected:
                partial = root / f"{name}.part"
                _download(url, partial, progress)
                actual = _sha1(partial)
                if actual != expected:
                    partial.unlink()
                    raise KeycloakMissing(
                        f"{url} has SHA-1 {actual}, but Maven Central publishes {expected}; "
                        "the download was damaged or altered: run the tests again to retry"
                    )
                partial.rename(archive)
        except (urllib.error.URLError, OSError) as e:
            raise KeycloakMissing(
                f"cannot download Keycloak {version} from {url} ({type(e).__name__}: {e}); "
                f"the OIDC tests need it once (then it is cached in {root})"
            ) from e
        staging = Path(tempfile.mkdtemp(prefix="unpacking-", dir=root))
        with zipfile.ZipFile(archive) as z:
            z.extractall(staging)
        for script in (staging / f"keycloak-{version}" / "bin").glob("*.sh"):
            script.chmod(0o755)  # zipfile does not keep the mode bits
        (staging / f"keycloak-{version}").rename(home)
        shutil.rmtree(staging)
        archive.unlink()  # the unpacked folder is what is kept
        progress(f"Keycloak {version} ready in {home} ({time.monotonic() - started:.0f} s)")
    return home


def _sha1(path: Path) -> str:
    digest = hashlib.sha1()  # what Maven Central publishes beside each file
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def java_home() -> Path:
    """A Java of at least ``JAVA_RELEASE``: ``$JAVA_HOME``, else the ``java`` on the PATH."""
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    if shutil.which("java"):
        candidates.append(Path(shutil.which("java")).resolve())
    for java in candidates:
        if not java.exists():
            continue
        answer = subprocess.run(
            [str(java), "-XshowSettings:properties", "-version"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        match = re.search(r"java\.specification\.version = (\d+)", answer.stderr)
        if match and int(match.group(1)) >= JAVA_RELEASE:
            return java.parent.parent
    raise KeycloakMissing(
        f"Keycloak {VERSION} needs Java {JAVA_RELEASE} or newer, and none was found "
        f"(looked at $JAVA_HOME and java on the PATH): "
        "apt-get install -y --no-install-recommends openjdk-17-jre-headless"
    )


class LocalKeycloak:
    """A running Keycloak: ``url``; ``create_realm``, group changes, ``stop()``."""

    def __init__(self, port: int | None = None, version: str = VERSION) -> None:
        self.version = version
        self.port = port or free_port()
        self.admin_password = os.urandom(12).hex()
        self.directory = Path(tempfile.mkdtemp(prefix="jupyterhub-gpu-keycloak-"))
        self.log_path = self.directory / "keycloak.log"
        self.process: subprocess.Popen | None = None
        #: seconds from launch until it answered (the tests report it)
        self.startup_seconds: float | None = None
        self._token: tuple[str, float] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _home(self, dist: Path) -> Path:
        """A home of this instance's own: what Keycloak writes (its build output, its
        data folder) is copied; the libraries (150 MiB) are linked."""
        home = self.directory / "home"
        (home / "lib").mkdir(parents=True)
        for part in ("bin", "conf", "providers", "themes"):
            shutil.copytree(dist / part, home / part, symlinks=True)
        shutil.copytree(dist / "lib" / "app", home / "lib" / "app")
        shutil.copy2(dist / "lib" / "quarkus-run.jar", home / "lib")
        # the build output of an earlier start-dev, when there is one: it saves the
        # start-up's build step (about 15 s); Keycloak rebuilds it if options changed
        built = dist.parent / "built-dev"
        shutil.copytree(
            built if built.exists() else dist / "lib" / "quarkus", home / "lib" / "quarkus"
        )
        (home / "lib" / "lib").symlink_to(dist / "lib" / "lib")
        return home

    def start(self, timeout: float = 240, progress: ProgressFn | None = None) -> LocalKeycloak:
        """Start Keycloak and wait until its master realm answers; on failure the error
        carries its log."""
        progress = progress or _say
        dist = distribution(self.version, progress)
        java = java_home()
        home = (
            self._home(dist) if not (self.directory / "home").exists() else self.directory / "home"
        )
        env = {
            **os.environ,
            "JAVA_HOME": str(java),
            "KC_BOOTSTRAP_ADMIN_USERNAME": ADMIN,
            "KC_BOOTSTRAP_ADMIN_PASSWORD": self.admin_password,
            # in memory: nothing to clean up, and a restart starts empty
            "KC_DB": "dev-mem",
            # no management interface (health and metrics off) and no clustering
            "KC_HEALTH_ENABLED": "false",
            "KC_METRICS_ENABLED": "false",
            "KC_HTTP_MANAGEMENT_PORT": str(free_port()),
            "KC_CACHE": "local",
            # its own URL in every token and page, whichever address a request came to
            # (a test's relay in front of it): a token is then valid through either
            "KC_HOSTNAME": self.url,
            "KC_LOG_LEVEL": "info",
            # a short-lived server: the quick compiler alone starts it sooner on few
            # cores than the server default
            "JAVA_OPTS_APPEND": "-XX:TieredStopAtLevel=1",
        }
        command = [
            str(home / "bin" / "kc.sh"),
            "start-dev",
            "--http-host=127.0.0.1",
            f"--http-port={self.port}",
        ]
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.directory,
                start_new_session=True,
            )
        progress(f"starting Keycloak {self.version} at {self.url} (log: {self.log_path})")
        deadline = started + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/realms/master", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError) as e:
                error: Exception = e
            if self.process.poll() is not None or time.monotonic() > deadline:
                code = self.process.poll()
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-4000:]
                raise RuntimeError(
                    f"Keycloak did not start on {self.url} within {timeout:.0f} s "
                    f"({'it exited with ' + str(code) if code is not None else error}); "
                    f"its log ({self.log_path}) ends:\n{tail}"
                )
            time.sleep(0.5)
        self.startup_seconds = time.monotonic() - started
        progress(f"Keycloak answered after {self.startup_seconds:.1f} s")
        self._keep_build(dist, home)
        return self

    @staticmethod
    def _keep_build(dist: Path, home: Path) -> None:
        """Keep this start's build output for the next instance (once, atomically)."""
        built = dist.parent / "built-dev"
        if built.exists():
            return
        staging = Path(tempfile.mkdtemp(prefix="built-", dir=dist.parent))
        shutil.copytree(home / "lib" / "quarkus", staging / "quarkus")
        # another instance may have kept its own meanwhile: the same build
        with contextlib.suppress(OSError):
            (staging / "quarkus").rename(built)
        shutil.rmtree(staging, ignore_errors=True)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None
        self._token = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalKeycloak:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the admin REST API ------------------------------------------------------------

    def _admin_token(self) -> str:
        if self._token and self._token[1] > time.monotonic():
            return self._token[0]
        form = urllib.parse.urlencode(
            {
                "grant_type": "password",
                "client_id": "admin-cli",
                "username": ADMIN,
                "password": self.admin_password,
            }
        ).encode()
        url = f"{self.url}/realms/master/protocol/openid-connect/token"
        with urllib.request.urlopen(url, form, timeout=30) as r:
            answer = json.load(r)
        self._token = (answer["access_token"], time.monotonic() + answer["expires_in"] - 10)
        return self._token[0]

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        """One admin REST call (``path`` under /admin/realms); its JSON answer or None.
        An error answer raises, with Keycloak's message."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}/admin/realms{path}",
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self._admin_token()}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            raise RuntimeError(
                f"Keycloak: {method} /admin/realms{path} answered {e.code}: "
                f"{e.read().decode(errors='replace')[:2000]}"
            ) from None
        return json.loads(text) if text else None

    def create_realm(self, realm: dict[str, Any]) -> None:
        """A realm from its representation (users, groups, clients, as an export has them)."""
        self.admin("POST", "", realm)

    def user_id(self, realm: str, username: str) -> str:
        users = self.admin("GET", f"/{realm}/users?exact=true&username={username}")
        if not users:
            raise KeyError(f"Keycloak realm {realm} has no user {username}")
        return users[0]["id"]

    def group_id(self, realm: str, path: str) -> str:
        return self.admin("GET", f"/{realm}/group-by-path/{path.lstrip('/')}")["id"]

    def add_to_group(self, realm: str, username: str, path: str) -> None:
        user, group = self.user_id(realm, username), self.group_id(realm, path)
        self.admin("PUT", f"/{realm}/users/{user}/groups/{group}")

    def remove_from_group(self, realm: str, username: str, path: str) -> None:
        user, group = self.user_id(realm, username), self.group_id(realm, path)
        self.admin("DELETE", f"/{realm}/users/{user}/groups/{group}")

    def groups_of(self, realm: str, username: str) -> list[str]:
        """The user's groups, by path."""
        user = self.user_id(realm, username)
        return sorted(g["path"] for g in self.admin("GET", f"/{realm}/users/{user}/groups"))


def main() -> int:
    """Download (if needed) and unpack the distribution; print its folder."""
    try:
        print(distribution())
    except KeycloakMissing as e:
        print(f"jupyterhub-gpu keycloak: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
