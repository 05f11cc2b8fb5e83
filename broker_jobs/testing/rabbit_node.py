"""A throwaway RabbitMQ node started from the locally installed rabbitmq-server.

Fault tests need a real broker they can kill and restart at will without touching the
system node (its cookie, data dir or the ``rabbitmq`` user).  So we run the lib-dir
``rabbitmq-server`` script directly (the ``/usr/sbin`` wrapper switches user and uses the
system cookie) with a private HOME/cookie, ports and data dir, all under ``base_dir``.
Nodes meant to form a cluster (:mod:`broker_jobs.testing.rabbit_cluster`) are created
with one shared ``cookie``; each still has a HOME of its own.

A node may also run from another distribution's RabbitMQ in a root of its own
(``root``: e.g. Debian 13's RabbitMQ 4.0 in a ``debootstrap`` tree, made by
``scripts/rabbitmq-root``): its commands run under ``chroot``, its files live under
``root``, and it registers with an epmd on a port of its own, apart from the host's.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from broker_jobs.store.processes import pid_alive
from broker_jobs.testing import ports
from broker_jobs.testing.processes import child_pids
from broker_jobs.testing.throwaway import Throwaway, newest, tail
from broker_jobs.testing.tls import ServerCertificates

SBIN_ENV = "BROKER_JOBS_RABBITMQ_SBIN"

#: Erlang flags: no busy-waiting schedulers (normal, dirty CPU and dirty I/O).
NO_BUSY_WAIT = "+sbwt none +sbwtdcpu none +sbwtdio none"
_LIB_GLOB = "usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin"


#: A dead-letter hop that the target queue did not confirm (say it was still starting
#: after a restart) is retried after this long: 180 s by default, which left a delayed
#: job minutes late after a restart. The same key (milliseconds) on 3.10 and 4.0
#: (docs/operations.md).
_ADVANCED_CONFIG = """[{rabbit, [
  {dead_letter_worker_publisher_confirm_timeout, 5000}
]}].
"""


class RabbitNodeError(Exception):
    """The throwaway node could not be found, started, stopped or queried."""


def _find_sbin(root: Path = Path("/")) -> Path | None:
    """The lib-dir sbin under ``root``: ``$BROKER_JOBS_RABBITMQ_SBIN`` if set (for the
    host's root), else the highest version."""
    if (override := os.environ.get(SBIN_ENV)) and root == Path("/"):
        return Path(override) if (Path(override) / "rabbitmq-server").is_file() else None
    return newest(p for p in root.glob(_LIB_GLOB) if (p / "rabbitmq-server").is_file())


#: Ports handed to the nodes created in this process. A killed node's ports are free
#: until it restarts; another node created meanwhile (a cluster next to the session's
#: single node) must not take them.
_HANDED_OUT: set[int] = set()


#: Where every rabbitmqctl on the machine puts its own dist listener.
_RABBITMQCTL_PORTS = frozenset(range(35672, 35683))


def free_port(taken: int = 0) -> int:
    """A free port (:func:`broker_jobs.testing.ports.free_port`: below the ephemeral
    range): if the AMQP port is taken the node boots, then dies ~8 s later. Skips
    rabbitmqctl's ports and those of every node created before in this process."""
    port = ports.free_port(avoid={taken, *_HANDED_OUT, *_RABBITMQCTL_PORTS})
    _HANDED_OUT.add(port)
    return port


def scratch_dir(prefix: str, root: Path | str | None = None) -> Path:
    """A new directory for a throwaway node: in ``root``'s ``/tmp`` for a node of
    another root (its chrooted tools see only that tree), else in the host's."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=Path(root) / "tmp" if root else None))


@dataclass
class RabbitNode(Throwaway):
    """One private RabbitMQ node; mnesia, logs, HOME and config all live under ``base_dir``."""

    base_dir: Path
    amqp_port: int
    dist_port: int
    nodename: str
    #: The Erlang cookie; None: a random one of this node's own. Nodes that form a
    #: cluster (or talk to each other at all) need the same one.
    cookie: str | None = None
    #: The filesystem root of the RabbitMQ installation ("/": the host's own).
    root: Path = Path("/")
    #: The epmd port of a node in another root (None: the host's default epmd).
    epmd_port: int | None = None
    #: A TLS listener's port and certificates (:meth:`with_tls`); None: plain AMQP only.
    tls_port: int | None = None
    tls: ServerCertificates | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @classmethod
    def create(
        cls,
        base_dir: Path | None = None,
        *,
        cookie: str | None = None,
        prefix: str = "bjtest",
        root: Path | str | None = None,
        epmd_port: int | None = None,
    ) -> RabbitNode:
        """Pick free ports and a unique node name; does not start anything.

        ``cookie``: the Erlang cookie to share with other nodes (default: a random one).
        ``prefix``: the node name's start (``<prefix>-<pid>-<random>@localhost``).
        ``root``: another root's RabbitMQ (see the module's docstring); ``base_dir``
        must then lie inside it (default: a new directory in its ``/tmp``), and the
        node registers with an epmd on ``epmd_port`` (default: a free port; nodes of
        one cluster share one).
        """
        tree = Path(root) if root else Path("/")
        base = Path(base_dir) if base_dir else scratch_dir("bjtest-rabbit-", root)
        if root and not base.resolve().is_relative_to(tree.resolve()):
            raise RabbitNodeError(f"the node's directory {base} is not inside its root {tree}")
        amqp = free_port()
        dist = free_port(taken=amqp)
        epmd = (epmd_port or free_port(taken=dist)) if root else None
        name = f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}@localhost"
        return cls(
            base_dir=base,
            amqp_port=amqp,
            dist_port=dist,
            nodename=name,
            cookie=cookie,
            root=tree,
            epmd_port=epmd,
        )

    def with_tls(self, certificates: ServerCertificates) -> RabbitNode:
        """This node (not started yet) with a TLS listener too (:attr:`tls_url`)."""
        self.tls, self.tls_port = certificates, free_port(taken=self.amqp_port)
        return self

    @property
    def tls_url(self) -> str:
        """``amqps://`` URL of the TLS listener, its CA given as ``cafile``."""
        if self.tls is None or self.tls_port is None:
            raise RabbitNodeError("this node has no TLS listener: create it with_tls()")
        return f"amqps://guest:guest@127.0.0.1:{self.tls_port}/?cafile={self.tls.ca}"

    @staticmethod
    def available(root: Path | str | None = None) -> bool:
        """Is a lib-dir rabbitmq-server installed (under ``root``)? Lets tests skip
        instead of fail."""
        return _find_sbin(Path(root) if root else Path("/")) is not None

    @property
    def url(self) -> str:
        """AMQP URL for the default guest user (allowed: we set ``loopback_users = none``)."""
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/"

    @property
    def pid_file(self) -> Path:
        return self.base_dir / "node.pid"

    @property
    def stdout_log(self) -> Path:
        return self.base_dir / "node-stdout.log"

    @property
    def rabbit_log(self) -> Path:
        return self.base_dir / "log" / f"{self.nodename}.log"

    @property
    def running(self) -> bool:
        """The node's OS process exists (a booting node counts as running)."""
        if self._proc is not None:
            return self._proc.poll() is None
        pid = self._read_pid()  # e.g. a node started by another RabbitNode on this base_dir
        return pid is not None and pid_alive(pid)

    def _sbin(self) -> Path:
        if (sbin := _find_sbin(self.root)) is None:
            where = f"{self.root}/{_LIB_GLOB}".replace("//", "/")
            raise RabbitNodeError(
                f"no rabbitmq-server under {where} (or ${SBIN_ENV}); "
                "install rabbitmq-server: apt-get install rabbitmq-server"
            )
        return sbin

    def inside(self, path: Path) -> Path:
        """``path`` as the node and its tools see it (under its root): a file handed
        to ``rabbitmqctl`` must lie in the root, e.g. in :attr:`base_dir`."""
        if self.root == Path("/"):
            return path
        return Path("/") / path.resolve().relative_to(self.root.resolve())

    def _command(self, tool: str) -> list[str]:
        """How to run one of the node's sbin tools: under ``chroot`` in another root."""
        sbin = self._sbin()
        if self.root == Path("/"):
            return [str(sbin / tool)]
        if not (self.root / "proc" / "self").exists():
            raise RabbitNodeError(
                f"{self.root}/proc is not mounted: mount --bind /proc {self.root}/proc"
                " (scripts/rabbitmq-root does it)"
            )
        return ["chroot", str(self.root), str(self.inside(sbin / tool))]

    def _env(self) -> dict[str, str]:
        """Env for server and CLI alike; the shared HOME gives both the same cookie."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RABBITMQ_") and k != "ERL_EPMD_PORT"
        }
        if self.epmd_port is not None:
            env["ERL_EPMD_PORT"] = str(self.epmd_port)
        b = self.inside(self.base_dir)
        env.update(
            HOME=str(b / "home"),
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(b / "mnesia"),
            RABBITMQ_LOG_BASE=str(b / "log"),
            RABBITMQ_PID_FILE=str(b / "node.pid"),
            RABBITMQ_CONFIG_FILE=str(b / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(b / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(b / "enabled_plugins"),  # none: faster boot
            RABBITMQ_CONF_ENV_FILE=str(b / "rabbitmq-env.conf"),  # not /etc/rabbitmq's
            # Schedulers that sleep when out of work instead of spinning: a test node
            # shares the cores with its clients, which a spinning scheduler takes from
            # (measured: tests/test_worker.py, test_published_ledger.py, test_delay.py,
            # test_dlq.py at -n 4, two interleaved rounds: 131 and 120 CPU-s spinning,
            # 114 and 116 not; wall 87 and 75 s against 72 and 73 s).
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=NO_BUSY_WAIT,
        )
        return env

    def _prepare(self) -> None:
        """Write the config files; the cookie only once (it is 0400, and must not change)."""
        for sub in ("home", "mnesia", "log"):
            (self.base_dir / sub).mkdir(parents=True, exist_ok=True)
        cookie = self.base_dir / "home" / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(self.cookie or secrets.token_hex(16).upper())
            cookie.chmod(0o400)
        conf = f"loopback_users = none\nlisteners.tcp.1 = 127.0.0.1:{self.amqp_port}\n"
        if self.tls is not None:
            conf += (
                f"listeners.ssl.1 = 127.0.0.1:{self.tls_port}\n"
                f"ssl_options.cacertfile = {self.tls.ca}\n"
                f"ssl_options.certfile = {self.tls.certificate}\n"
                f"ssl_options.keyfile = {self.tls.key}\n"
                "ssl_options.verify = verify_none\n"
                "ssl_options.fail_if_no_peer_cert = false\n"
            )
        (self.base_dir / "rabbitmq.conf").write_text(conf)
        (self.base_dir / "advanced.config").write_text(_ADVANCED_CONFIG)
        (self.base_dir / "enabled_plugins").write_text("[].\n")
        (self.base_dir / "rabbitmq-env.conf").write_text("")

    def beam_pid(self) -> int | None:
        """The running node's Erlang VM process (for benchmarks that read its CPU)."""
        return self._read_pid()

    def _read_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _in_epmd(self) -> bool:
        short = self.nodename.split("@", 1)[0]
        epmd = [shutil.which("epmd") or "epmd", "-names"]
        if self.epmd_port is not None:
            epmd[1:1] = ["-port", str(self.epmd_port)]
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            out = subprocess.run(
                epmd, check=False, capture_output=True, text=True, timeout=10
            ).stdout
            return any(line.split()[1:2] == [short] for line in out.splitlines())
        return False

    def _error(self, what: str) -> RabbitNodeError:
        tails = f"{tail(self.stdout_log)}\n{tail(self.rabbit_log)}"
        return RabbitNodeError(f"{what} (node {self.nodename})\n{tails}")

    def start(self, timeout: float = 60.0) -> None:
        """Boot (same data dir and ports as before) and wait until AMQP accepts connections."""
        if self.running:
            raise RabbitNodeError(f"{self.nodename} is already running; stop() it first")
        command = self._command("rabbitmq-server")
        busy = [p for p in (self.amqp_port, self.dist_port) if not ports.port_free(p)]
        if busy:  # else the node boots, then dies ~8 s later (and a TCP probe would lie)
            raise RabbitNodeError(f"port(s) {busy} of {self.nodename} in use; create() anew")
        self._prepare()
        self.pid_file.unlink(missing_ok=True)
        # Output goes to a file, not a pipe: nobody reads a pipe, and a full one blocks the node.
        with self.stdout_log.open("ab") as log:
            self._proc = subprocess.Popen(
                command,
                env=self._env(),
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the test run must not hit the node first
            )
        try:
            self._await_boot(self._proc, time.monotonic() + timeout)
        except BaseException as boot_error:
            try:
                self.kill()  # never leave a half-booted node behind
            except RabbitNodeError as kill_error:  # the boot's failure is the news, not this
                boot_error.add_note(f"and then: {kill_error}")
            raise

    def _await_boot(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        # await_startup fails at once for a node epmd does not know yet, so poll epmd first.
        while not self._in_epmd():
            if proc.poll() is not None:
                raise self._error(f"rabbitmq-server exited with {proc.returncode} during boot")
            if time.monotonic() > deadline:
                raise self._error("node did not register with epmd in time")
            time.sleep(0.1)
        left = max(1.0, deadline - time.monotonic())
        try:
            self.ctl("await_startup", "--timeout", str(int(left) + 1), timeout=left + 10)
        except RabbitNodeError as exc:
            raise self._error(f"await_startup failed: {exc}") from exc
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.amqp_port), timeout=1).close()
                return
            time.sleep(0.1)
        raise self._error(f"AMQP port {self.amqp_port} never accepted connections")

    def _beam_pids(self) -> set[int]:
        """beam's pid from the pid file or, early in boot, as the wrapper shell's child."""
        pids = {p for p in [self._read_pid()] if p}
        if self._proc is not None and self._proc.poll() is None:
            pids |= child_pids(self._proc.pid)
        return pids

    def _wait_gone(self, pids: set[int], deadline: float) -> bool:
        """Wait until beam and our wrapper shell exited (the shell reaps beam: no zombie)."""
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self.running and not any(pid_alive(p) for p in pids)

    def _forget(self) -> None:
        self._proc = None
        self.pid_file.unlink(missing_ok=True)  # a stale pid may later belong to someone else

    def stop(self, timeout: float = 60.0) -> None:
        """Stop gracefully (else the dist port clashes on restart); waits for the process.

        Falls back to kill() (and raises) if the graceful stop fails, so a teardown never
        leaves a node behind.
        """
        if not self.running:
            return
        pids, deadline = self._beam_pids(), time.monotonic() + timeout
        try:
            # returns once beam exited
            self.ctl("stop", str(self.inside(self.pid_file)), timeout=timeout)
        except RabbitNodeError:
            self.kill()
            raise
        if not self._wait_gone(pids, deadline):
            self.kill()
            raise self._error(f"node still alive {timeout}s after rabbitmqctl stop; killed it")
        self._forget()

    def halt(self) -> None:
        """kill(): the node's data is deleted next, so a graceful stop (rabbitmqctl
        stop, an Erlang VM of its own: ~2.5 s at the end of each test session) would
        only write what nobody reads."""
        if self.running:
            self.kill()

    def kill(self, timeout: float = 30.0) -> None:
        """SIGKILL beam (a crash: nothing graceful) and wait until start() can reuse the ports.

        Gotcha on RabbitMQ 3.10 (Ra 2.2; fixed upstream by rabbitmq/ra#443, 2024): Ra saves
        its name registry (names.dets) only every 500 ms, so a quorum queue declared less
        than ~0.5 s before kill() comes back *empty* (recreated) after start(). Let a
        second pass between declaring a quorum queue and killing the node.
        """
        pids, deadline = self._beam_pids(), time.monotonic() + timeout
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not self._wait_gone(pids, min(deadline, time.monotonic() + 5)) and self._proc:
            self._proc.kill()  # the wrapper shell should have exited with beam; make sure
        if not self._wait_gone(pids, deadline):
            raise RabbitNodeError(f"{self.nodename} survived SIGKILL for {timeout}s")
        self._forget()
        while self._in_epmd() or not all(map(ports.port_free, (self.dist_port, self.amqp_port))):
            if time.monotonic() > deadline:
                raise RabbitNodeError(f"{self.nodename}: epmd name/ports not released after kill")
            time.sleep(0.05)

    def restart(self) -> None:
        """Graceful stop() then start(), keeping data dir and ports.

        Right after start() returns, quorum-queue message counts (e.g. a passive
        queue.declare) can read low for ~0.1-2 s while the Raft log replays: poll for
        the expected count instead of asserting it once.
        """
        self.stop()
        self.start()

    def _run(self, tool: str, *args: str, timeout: float) -> str:
        cmd = [*self._command(tool), "-n", self.nodename, *args]
        try:
            res = subprocess.run(
                cmd, check=False, env=self._env(), capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise RabbitNodeError(f"{' '.join(cmd)} timed out after {timeout}s") from exc
        if res.returncode != 0:
            raise RabbitNodeError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stderr}")
        return res.stdout

    def ctl_command_line(self) -> str:
        """A shell command line running rabbitmqctl against this node (its cookie is in
        its HOME; under ``chroot`` for another root), for tools that take one."""
        env = [f"HOME={self.inside(self.base_dir / 'home')}"]
        if self.epmd_port is not None:
            env.append(f"ERL_EPMD_PORT={self.epmd_port}")
        return shlex.join(["env", *env, *self._command("rabbitmqctl"), "-n", self.nodename])

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run rabbitmqctl against this node (with its cookie) and return its stdout."""
        return self._run("rabbitmqctl", *args, timeout=timeout)

    def server_version(self) -> str:
        """The running server's version (``rabbitmqctl version`` is the CLI's own)."""
        return self._run("rabbitmq-diagnostics", "-q", "server_version", timeout=60.0).strip()

    def scratch_dirs(self) -> tuple[Path, ...]:
        return (self.base_dir,)
