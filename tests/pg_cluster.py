"""A private PostgreSQL server for tests that stop, restart or crash it (the shared test server
is never restarted): ``initdb`` into a temporary directory, ``pg_ctl`` on a free port, trust
authentication for ``root`` on 127.0.0.1 only. As root the server runs as the ``postgres``
user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PrivateCluster:
    """One PostgreSQL server of the test's own. :meth:`stop` (``fast``: sessions ended, or
    ``immediate``: as a crash) and :meth:`start` may be called any number of times."""

    def __init__(self, root: Path, bin_dir: Path, port: int) -> None:
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.bin = bin_dir
        self.port = port
        self.url = f"postgresql://root@127.0.0.1:{port}/postgres"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=120)

    def init(self) -> None:
        if self._as_postgres:
            uid = pwd.getpwnam("postgres").pw_uid
            os.chown(self.root, uid, -1)
        self._run("initdb", "-D", str(self.data), "-U", "root", "--auth=trust", "-E", "UTF8")
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\nmax_connections = 100\n"
                "fsync = off\nshared_buffers = 32MB\n"
            )

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://root@127.0.0.1:{self.port}/{name}"

    def destroy(self) -> None:
        if self.data.exists():
            with contextlib.suppress(subprocess.SubprocessError):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def private_cluster_or_skip() -> Iterator[PrivateCluster]:
    """A started :class:`PrivateCluster`, destroyed afterwards; the test is skipped (with the
    reason) where no PostgreSQL server binaries are installed or none can run here."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) to run a private server")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root without a postgres user to run a private server as")
    root = Path(tempfile.mkdtemp(prefix="affidavit-pg-"))
    cluster = PrivateCluster(root, bin_dir, _free_port())
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
