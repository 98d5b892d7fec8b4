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

from .localcluster.cluster import free_port


class PostgresMissing(RuntimeError):
    """Debian's postgresql (or psycopg2) is not installed."""


def server_binaries() -> Path:
    binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not binaries:
        raise PostgresMissing("PostgreSQL needs Debian's postgresql: apt-get install postgresql")
    return Path(binaries[-1]).parent


@contextlib.contextmanager
def throwaway_postgres(database: str = "hub") -> Iterator[str]:
    """Start a server, create ``database``, yield its SQLAlchemy URL; stop and remove it."""
    try:
        import psycopg2  # noqa: F401  (SQLAlchemy's PostgreSQL driver)
    except ImportError:
        raise PostgresMissing("PostgreSQL needs psycopg2: pip install psycopg2-binary") from None
    bin_dir = server_binaries()
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    data = Path(tempfile.mkdtemp(prefix="jupyterhub-gpu-postgres-"))
    if as_owner:
        shutil.chown(data, "postgres")
    port = free_port()

    def run(*argv) -> None:
        subprocess.run([*as_owner, *argv], check=True, capture_output=True)

    try:
        run(bin_dir / "initdb", "-D", data / "db", "-A", "trust", "-U", "postgres")
        options = f"-h 127.0.0.1 -p {port} -k {data}"
        run(bin_dir / "pg_ctl", "-D", data / "db", "-o", options, "-l", data / "log", "-w", "start")
        try:
            address = ["-h", "127.0.0.1", "-p", str(port)]
            run(bin_dir / "createdb", *address, "-U", "postgres", database)
            yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{database}"
        finally:
            run(bin_dir / "pg_ctl", "-D", data / "db", "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(data, ignore_errors=True)
