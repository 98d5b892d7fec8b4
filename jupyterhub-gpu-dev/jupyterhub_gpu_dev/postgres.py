"""A throwaway PostgreSQL server (Debian's ``postgresql`` package) on 127.0.0.1.

For the tests of the usage database and the spawn-storm benchmark's hub
database: a fresh cluster in a temporary folder, trust authentication, one
database; stopped and removed on exit. PostgreSQL refuses to run as root, so as
root it runs as Debian's ``postgres`` user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .localcluster.cluster import free_port


class PostgresMissing(RuntimeError):
    """Debian's postgresql (or psycopg2) is not installed."""


def server_binaries() -> Path:
    binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not binaries:
        raise PostgresMissing("PostgreSQL needs Debian's postgresql: apt-get install postgresql")
    return Path(binaries[-1]).parent


class LocalPostgres:
    """A running throwaway server: its ``url``, and ``stop()`` and ``start()`` for an
    outage (the same data, port and URL when it starts again)."""

    def __init__(self, bin_dir: Path, data: Path, port: int, as_owner: list[str]) -> None:
        self.bin_dir, self.data, self.port, self.as_owner = bin_dir, data, port, as_owner
        self.url = ""
        self.running = False

    def run(self, *argv: Any) -> None:
        subprocess.run([*self.as_owner, *argv], check=True, capture_output=True)

    def start(self) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.data}"
        self.run(
            self.bin_dir / "pg_ctl",
            "-D",
            self.data / "db",
            "-o",
            options,
            "-l",
            self.data / "log",
            "-w",
            "start",
        )
        self.running = True

    def create_database(self, name: str) -> str:
        """Create the database ``name``; its SQLAlchemy URL."""
        address = ["-h", "127.0.0.1", "-p", str(self.port)]
        self.run(self.bin_dir / "createdb", *address, "-U", "postgres", name)
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """Stop at once: open connections are cut, as when the server goes down."""
        self.run(self.bin_dir / "pg_ctl", "-D", self.data / "db", "-m", "fast", "-w", "stop")
        self.running = False


@contextlib.contextmanager
def postgres_server(database: str = "hub") -> Iterator[LocalPostgres]:
    """Start a server, create ``database``, yield it (``.url``); stop and remove it."""
    try:
        import psycopg2  # noqa: F401  (SQLAlchemy's PostgreSQL driver)
    except ImportError:
        raise PostgresMissing("PostgreSQL needs psycopg2: pip install psycopg2-binary") from None
    bin_dir = server_binaries()
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    data = Path(tempfile.mkdtemp(prefix="jupyterhub-gpu-postgres-"))
    if as_owner:
        shutil.chown(data, "postgres")
    server = LocalPostgres(bin_dir, data, free_port(), as_owner)
    try:
        server.run(bin_dir / "initdb", "-D", data / "db", "-A", "trust", "-U", "postgres")
        server.start()
        try:
            server.url = server.create_database(database)
            yield server
        finally:
            if server.running:
                server.stop()
    finally:
        shutil.rmtree(data, ignore_errors=True)


@contextlib.contextmanager
def throwaway_postgres(database: str = "hub") -> Iterator[str]:
    """Start a server, create ``database``, yield its SQLAlchemy URL; stop and remove it."""
    with postgres_server(database) as server:
        yield server.url
