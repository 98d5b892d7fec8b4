"""A throwaway OpenLDAP directory (Debian's ``slapd`` package) on 127.0.0.1.

For the tests of the LDAP login with groups (``jupyterhub_gpu.auth.ldap``): a
fresh ``mdb`` database in a temporary folder, laid out as
``helm-values/university.yaml`` assumes: people at
``uid=NAME,ou=people,dc=example,dc=edu``, groups under
``ou=groups,dc=example,dc=edu`` (groupOfNames with ``member``, posixGroup with
``memberUid``), and ``memberOf`` on each person kept by the ``memberof``
overlay. slapd runs in the foreground as the current user on a free loopback
port; it never touches a system slapd (its own configuration file, database,
pid file and port). Entries are added over LDAP after start-up, so the overlay
sees them.

    with LocalDirectory() as directory:
        directory.add_person("alice", "secret")
        directory.add_group("research", ["alice"])
        directory.url  # ldap://127.0.0.1:PORT

With ``tls=(certificate, key)`` (PEM files whose certificate names 127.0.0.1,
e.g. from ``server_certificate``) it also serves LDAPS on ``ldaps_port`` and
StartTLS on ``port``, for the tests that the hub checks the directory's
certificate:

    ca = CertificateAuthority()
    with LocalDirectory(tls=server_certificate(ca, folder)) as directory:
        directory.ldaps_url  # ldaps://127.0.0.1:PORT
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from .localcluster.cluster import free_port

SUFFIX = "dc=example,dc=edu"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
ADMIN_DN = f"cn=admin,{SUFFIX}"
SCHEMA = Path("/etc/ldap/schema")
MODULES = Path("/usr/lib/ldap")
GroupKind = Literal["groupOfNames", "posixGroup"]


class SlapdMissing(RuntimeError):
    """Debian's slapd (or the ldap3 client) is not installed."""


def slapd_binary() -> str:
    found = shutil.which("slapd") or shutil.which("slapd", path="/usr/sbin:/sbin")
    if not found or not (SCHEMA / "nis.schema").exists():
        raise SlapdMissing(
            "the LDAP tests need Debian's slapd: "
            "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slapd"
        )
    return found


def person_dn(name: str) -> str:
    return f"uid={name},{PEOPLE}"


def group_dn(name: str) -> str:
    return f"cn={name},{GROUPS}"


class LocalDirectory:
    """A running slapd: ``url``, ``port``; ``stop()`` and ``start()`` for an outage
    (the same data and port when it starts again); people and groups to add and change."""

    def __init__(self, port: int | None = None, tls: tuple[Path, Path] | None = None) -> None:
        self.binary = slapd_binary()
        try:
            import ldap3  # noqa: F401  (the client entries are added with)
        except ImportError:
            raise SlapdMissing(
                "the local directory needs ldap3: pip install 'jupyterhub-gpu[ldap]'"
            ) from None
        self.directory = Path(tempfile.mkdtemp(prefix="jupyterhub-gpu-slapd-"))
        self.port = port or free_port()
        self.tls = tls
        # slapd takes its ports on its command line: the OS cannot choose them at bind
        self.ldaps_port = free_port() if tls else None
        self.admin_password = "directory-admin"
        self.process: subprocess.Popen | None = None
        self.log_path = self.directory / "slapd.log"
        self._next_id = 10000
        (self.directory / "data").mkdir()
        (self.directory / "slapd.conf").write_text(self._config())

    @property
    def url(self) -> str:
        return f"ldap://127.0.0.1:{self.port}"

    @property
    def ldaps_url(self) -> str:
        if not self.ldaps_port:
            raise RuntimeError("this LocalDirectory serves no LDAPS: give it tls=(cert, key)")
        return f"ldaps://127.0.0.1:{self.ldaps_port}"

    def _config(self) -> str:
        schemas = "\n".join(
            f"include {SCHEMA / name}.schema" for name in ("core", "cosine", "nis", "inetorgperson")
        )
        tls = (
            f"TLSCertificateFile {self.tls[0]}\nTLSCertificateKeyFile {self.tls[1]}\n"
            if self.tls
            else ""
        )
        return f"""\
# written by jupyterhub_gpu_dev.ldap
{schemas}
{tls}pidfile {self.directory}/slapd.pid
argsfile {self.directory}/slapd.args
modulepath {MODULES}
moduleload back_mdb
moduleload memberof
database mdb
maxsize 67108864
suffix "{SUFFIX}"
rootdn "{ADMIN_DN}"
rootpw {self.admin_password}
directory {self.directory}/data
index objectClass eq
index member,memberUid eq
overlay memberof
# people bind with their password and read the directory, as at most sites
access to attrs=userPassword by self write by anonymous auth by * none
access to * by * read
"""

    def start(self, timeout: float = 20) -> LocalDirectory:
        """Start slapd and wait until it answers; on failure the error carries its log."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                # -d: stay in the foreground (stats: one line per operation, for failures)
                [
                    self.binary,
                    "-f",
                    str(self.directory / "slapd.conf"),
                    "-h",
                    " ".join([self.url + "/"] + ([self.ldaps_url + "/"] if self.tls else [])),
                    "-d",
                    "stats",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.connection().unbind()
                return self
            except Exception as e:  # re-raised below with the log, once out of time
                error = e
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-4000:]
                raise RuntimeError(
                    f"slapd did not start on {self.url} ({type(error).__name__}: {error}); "
                    f"its log ({self.log_path}) ends:\n{tail}"
                ) from error
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop slapd at once: the directory is down until ``start()``."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalDirectory:
        try:
            self.start()
            self._add(SUFFIX, ["dcObject", "organization"], {"dc": "example", "o": "Example"})
            for ou in ("people", "groups"):
                self._add(f"ou={ou},{SUFFIX}", ["organizationalUnit"], {"ou": ou})
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- entries ------------------------------------------------------------------

    def connection(self):
        """An ldap3 connection bound as the directory's admin."""
        import ldap3

        server = ldap3.Server("127.0.0.1", port=self.port, connect_timeout=5)
        return ldap3.Connection(
            server,
            ADMIN_DN,
            self.admin_password,
            auto_bind=ldap3.AUTO_BIND_NO_TLS,
            raise_exceptions=True,
            receive_timeout=10,
        )

    def _add(self, dn: str, classes: list[str], attributes: dict[str, Any]) -> None:
        conn = self.connection()
        try:
            conn.add(dn, classes, attributes)
        finally:
            conn.unbind()

    def add_entry(self, dn: str, classes: list[str], attributes: dict[str, Any]) -> str:
        """Any entry, anywhere below the suffix (a group outside ``ou=groups``, say);
        returns its DN. A refusal raises, with the directory's answer."""
        self._add(dn, classes, attributes)
        return dn

    def add_person(self, name: str, password: str) -> str:
        """``uid=NAME,ou=people,...`` with a password and posix IDs; returns its DN."""
        self._next_id += 1
        attributes = {
            "uid": name,
            "cn": name,
            "sn": name,
            "userPassword": password,
            "uidNumber": self._next_id,
            "gidNumber": self._next_id,
            "homeDirectory": f"/home/{name}",
        }
        self._add(person_dn(name), ["inetOrgPerson", "posixAccount"], attributes)
        return person_dn(name)

    def add_group(
        self,
        name: str,
        members: Iterable[str],
        kind: GroupKind = "groupOfNames",
        gid_number: int | None = None,
    ) -> str:
        """A group under ``ou=groups`` with these people (by uid); returns its DN.

        ``groupOfNames`` lists members by DN (``member``; the overlay sets their
        ``memberOf``), ``posixGroup`` by uid (``memberUid``).
        """
        members = list(members)
        if kind == "groupOfNames":
            # groupOfNames needs a member: an empty group holds the group's own DN (RFC 4519)
            attributes: dict[str, Any] = {
                "cn": name,
                "member": [person_dn(m) for m in members] or [group_dn(name)],
            }
        else:
            self._next_id += 1
            attributes = {"cn": name, "gidNumber": gid_number or self._next_id}
            if members:
                attributes["memberUid"] = members
        self._add(group_dn(name), [kind], attributes)
        return group_dn(name)

    def set_members(self, name: str, members: Iterable[str]) -> None:
        """Replace a group's members (people by uid), as an admin moving people does."""
        import ldap3

        conn = self.connection()
        try:
            conn.search(group_dn(name), "(objectClass=*)", ldap3.BASE, attributes=["objectClass"])
            classes = {c.lower() for c in conn.entries[0].objectClass.values}
            members = list(members)
            if "posixgroup" in classes:
                change = {"memberUid": [(ldap3.MODIFY_REPLACE, members)]}
            else:
                dns = [person_dn(m) for m in members] or [group_dn(name)]
                change = {"member": [(ldap3.MODIFY_REPLACE, dns)]}
            conn.modify(group_dn(name), change)
        finally:
            conn.unbind()

    def member_of(self, name: str) -> list[str]:
        """The ``memberOf`` values the overlay keeps on a person."""
        import ldap3

        conn = self.connection()
        try:
            conn.search(person_dn(name), "(objectClass=*)", ldap3.BASE, attributes=["memberOf"])
            return [str(v) for v in conn.entries[0].memberOf.values]
        finally:
            conn.unbind()


def server_certificate(ca: Any, folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost signed by ``ca`` (a
    ``jupyterhub_gpu_dev.localcluster.pki.CertificateAuthority``), written to
    ``folder`` with its key and the CA's certificate (``ca.crt``, for clients):
    (certificate, key)."""
    cert, key = ca.issue("127.0.0.1", server_names=["localhost"], server_ips=["127.0.0.1"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.crt").write_bytes(ca.cert_pem)
    (folder / "ldap.crt").write_bytes(cert)
    (folder / "ldap.key").write_bytes(key)
    (folder / "ldap.key").chmod(0o600)
    return folder / "ldap.crt", folder / "ldap.key"
