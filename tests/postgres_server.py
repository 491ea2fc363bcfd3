"""A real PostgreSQL server on loopback for the tests and the benchmarks, started from the
Debian packages (``apt-get install postgresql``; ``.ci/run`` installs them).

Why not a server that is already running: CI starts with none, and a test suite that needs the
developer's own server would read or damage its data. Each session gets a new cluster in a
temporary directory on a free port, owned by the ``postgres`` user when the tests run as root
(``initdb`` refuses root), and stopped at the end.

``fsync`` is off for the tests (nothing here survives a power cut anyway); the benchmark starts
its own server with ``durable=True`` so its figures include the commit's flush.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PostgresServer", "find_bin_dir", "running_postgres"]

REQUIRE_ENV = "DATAMACHINE_REQUIRE_POSTGRES"


def find_bin_dir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (Debian keeps them off the PATH)."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PostgresServer:
    """A running cluster: ``url`` reaches its ``postgres`` database as the superuser."""

    port: int
    directory: Path
    bin_dir: Path
    as_user: str | None

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def command(self, *args: str) -> list[str]:
        if self.as_user is None:
            return list(args)
        return ["runuser", "-u", self.as_user, "--", *args]

    def new_databases(self, count: int) -> list[str]:
        """The URLs of ``count`` new, empty databases (not migrated: a first boot does it)."""
        import psycopg

        names = [f"dm_empty_{uuid.uuid4().hex[:12]}" for _ in range(count)]
        with psycopg.connect(self.url, autocommit=True) as admin:
            for name in names:
                admin.execute(f"CREATE DATABASE {name}")
        return [self.url_for(name) for name in names]

    def stop(self) -> None:
        subprocess.run(self.command(str(self.bin_dir / "pg_ctl"), "-D",
                                    str(self.directory / "data"), "-m", "immediate", "-w",
                                    "stop"), capture_output=True, check=False)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_postgres(*, durable: bool = False, max_connections: int = 200) -> PostgresServer:
    """Create and start a new cluster (see the module docstring); stop it with ``stop()``."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise FileNotFoundError("PostgreSQL's initdb and pg_ctl were not found; install the "
                                "server (apt-get install postgresql).")
    as_user = "postgres" if os.geteuid() == 0 else None
    directory = Path(tempfile.mkdtemp(prefix="dm-postgres-"))
    if as_user is not None:
        shutil.chown(directory, user=as_user)
    server = PostgresServer(_free_port(), directory, bin_dir, as_user)
    data, sockets = directory / "data", directory / "sockets"
    try:
        subprocess.run(server.command("mkdir", str(sockets)), check=True)
        subprocess.run(server.command(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres",
                                      "--auth=trust", "-E", "UTF8", "--locale=C"),
                       check=True, capture_output=True)
        options = [f"-p {server.port}", f"-k {sockets}", "-h 127.0.0.1",
                   f"-c max_connections={max_connections}"]
        if not durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        subprocess.run(server.command(str(bin_dir / "pg_ctl"), "-D", str(data), "-l",
                                      str(directory / "server.log"), "-o", " ".join(options),
                                      "-w", "-t", "60", "start"),
                       check=True, capture_output=True)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def running_postgres(*, durable: bool = False) -> Iterator[PostgresServer]:
    """A new server for the duration of the block."""
    server = start_postgres(durable=durable)
    try:
        yield server
    finally:
        server.stop()
