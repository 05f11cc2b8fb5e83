"""A throwaway PostgreSQL cluster started from the locally installed server binaries.

Store tests need a real PostgreSQL they own, without touching the system cluster
(Debian's ``main`` cluster, its config or port). So we run ``initdb`` and ``pg_ctl``
from ``/usr/lib/postgresql/VERSION/bin`` (the highest installed version, or
``$BROKER_JOBS_PG_BIN``) on a private data directory, a free TCP port on 127.0.0.1 and
a private socket directory. Authentication is ``trust`` for the superuser
``postgres``; durability settings are off (``fsync``, ``synchronous_commit``,
``full_page_writes``): this cluster is for tests only and is thrown away.

PostgreSQL refuses to run as root. When this process is root, initdb and pg_ctl run
as an unprivileged user (``postgres`` when the Debian package created it, else
``nobody``) through ``runuser``, and the cluster lives in a directory of its own under
the system temp dir, owned by that user: pytest's ``tmp_path`` directories are 0700
root, so that user could not even reach a cluster inside them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from broker_jobs.testing.ports import free_port
from broker_jobs.testing.throwaway import Throwaway, newest, tail

BIN_ENV = "BROKER_JOBS_PG_BIN"
_BIN_GLOB = "usr/lib/postgresql/*/bin"
#: Unprivileged users tried, in order, when this process runs as root.
_RUN_AS_CANDIDATES = ("postgres", "nobody")
#: The cluster's superuser (``initdb -U``); the DSN connects as it.
SUPERUSER = "postgres"


class PostgresNodeError(Exception):
    """The throwaway cluster could not be found, created, started or stopped."""


def _find_bin() -> Path | None:
    """The bin dir holding initdb: ``$BROKER_JOBS_PG_BIN`` if set, else the highest version."""
    if override := os.environ.get(BIN_ENV):
        return Path(override) if (Path(override) / "initdb").is_file() else None
    return newest(p for p in Path("/").glob(_BIN_GLOB) if (p / "initdb").is_file())


def _run_as_user() -> pwd.struct_passwd | None:
    """The user to run PostgreSQL as: None when we are not root (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in _RUN_AS_CANDIDATES:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PostgresNodeError(
        f"running as root and none of the users {', '.join(_RUN_AS_CANDIDATES)} exists:"
        " PostgreSQL refuses to run as root; create an unprivileged user"
    )


@dataclass
class PostgresNode(Throwaway):
    """One private PostgreSQL cluster; data, socket and log all live under ``cluster_dir``.

    ``cluster_dir`` is ``base_dir`` itself, except as root (see the module docstring),
    where it is a fresh directory under the system temp dir.
    """

    base_dir: Path
    cluster_dir: Path
    port: int
    run_as: str | None = None
    #: False (tests): fsync, synchronous commits and full-page writes off, for speed;
    #: a crash (kill -9) then loses commits already acknowledged. True: PostgreSQL's
    #: durable defaults, for fault scenarios that kill the server.
    durable: bool = False

    @classmethod
    def create(cls, base_dir: Path | None = None, *, durable: bool = False) -> PostgresNode:
        """Pick a free port and the directories; does not run anything."""
        base = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="bjtest-pg-"))
        base.mkdir(parents=True, exist_ok=True)
        user = _run_as_user()
        if user is None:
            cluster = base
        else:
            cluster = Path(tempfile.mkdtemp(prefix="bjtest-pg-"))
            os.chown(cluster, user.pw_uid, user.pw_gid)
        return cls(
            base_dir=base,
            cluster_dir=cluster,
            port=free_port(),
            run_as=user.pw_name if user else None,
            durable=durable,
        )

    @staticmethod
    def available() -> bool:
        """Is initdb installed? Lets tests skip instead of fail."""
        return _find_bin() is not None

    @property
    def dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    @property
    def data_dir(self) -> Path:
        return self.cluster_dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.cluster_dir / "socket"

    @property
    def log_file(self) -> Path:
        return self.cluster_dir / "postgres.log"

    @property
    def running(self) -> bool:
        """pg_ctl says a server runs on our data directory."""
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        res = self._run("pg_ctl", "status", "-D", str(self.data_dir), check=False, timeout=30)
        return res.returncode == 0

    def _bin(self) -> Path:
        if (found := _find_bin()) is None:
            raise PostgresNodeError(
                f"no initdb under /{_BIN_GLOB} (or ${BIN_ENV}); install PostgreSQL:"
                " apt-get install postgresql"
            )
        return found

    def _run(
        self, tool: str, *args: str, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self._bin() / tool), *args]
        if self.run_as is not None:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        try:
            res = subprocess.run(
                cmd,
                check=False,
                env=env,
                cwd=self.cluster_dir,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired as exc:
            raise PostgresNodeError(f"{' '.join(cmd)} timed out after {timeout}s") from exc
        if check and res.returncode != 0:
            raise PostgresNodeError(
                f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}\n"
                f"{tail(self.log_file)}"
            )
        return res

    def _initdb(self) -> None:
        self.socket_dir.mkdir(exist_ok=True)
        if self.run_as is not None:
            user = pwd.getpwnam(self.run_as)
            os.chown(self.socket_dir, user.pw_uid, user.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )

    def start(self, timeout: float = 60.0) -> None:
        """initdb on first use, then start the server and wait until it accepts connections."""
        if self.running:
            raise PostgresNodeError(f"PostgreSQL on port {self.port} already runs; stop() it")
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        options = " ".join(
            [
                f"-p {self.port}",
                f"-k {self.socket_dir}",
                "-c listen_addresses=127.0.0.1",
                *(
                    ()
                    if self.durable
                    else ("-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off")
                ),
            ]
        )
        self._run(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            str(int(timeout)),
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_file),
            "-o",
            options,
            timeout=timeout + 10,
        )

    def stop(self, timeout: float = 60.0) -> None:
        """Fast shutdown (open sessions are ended); waits until the server exited."""
        if not self.running:
            return
        self._run(
            "pg_ctl",
            "stop",
            "-w",
            "-m",
            "fast",
            "-t",
            str(int(timeout)),
            "-D",
            str(self.data_dir),
            timeout=timeout + 10,
        )

    def scratch_dirs(self) -> tuple[Path, ...]:
        if self.base_dir == self.cluster_dir:
            return (self.cluster_dir,)
        return self.cluster_dir, self.base_dir
