"""`strom cluster up`: a ZooKeeper and N brokers on this machine, for development and trials."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import click

from strom.zookeeper_server import ZooKeeperServer, zookeeper_available

DEFAULT_CHROOT = "/strom"


@click.group()
def cluster() -> None:
    """Run a Strom cluster on this machine."""


class _Broker:
    """One `strom serve` child: its stdout and stderr go to <dir>/strom.log; the ready line it
    prints on stdout tells us it serves."""

    def __init__(self, broker_id: int, port: int, directory: Path, zk_connect: str,
                 overrides: tuple[str, ...]) -> None:
        self.broker_id, self.port, self.directory = broker_id, port, directory
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "strom.log"
        settings = [f"broker.id={broker_id}", f"listeners=PLAINTEXT://127.0.0.1:{port}",
                    f"log.dirs={directory / 'logs'}", f"zookeeper.connect={zk_connect}",
                    *overrides]
        args = [sys.executable, "-m", "strom", "serve"]
        for setting in settings:
            args += ["--override", setting]
        self.ready = threading.Event()
        self._log = open(self.log_path, "a")  # noqa: SIM115 - closed when the broker is stopped
        # A session of its own: Ctrl-C in the terminal reaches only us, and we stop the brokers
        # before ZooKeeper, not all at once.
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, start_new_session=True)
        threading.Thread(target=self._copy_stdout, args=(self.proc.stdout,), daemon=True).start()

    def _copy_stdout(self, stdout: IO[str]) -> None:
        for line in stdout:
            self._log.write(line)
            self._log.flush()
            if " ready on " in line:
                self.ready.set()

    def last_lines(self, count: int = 5) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-count:])

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _parse_override(ctx: click.Context, param: click.Parameter,
                    values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        if "=" not in value:
            raise click.BadParameter(f"expected KEY=VALUE, got {value!r}")
    return values


@cluster.command()
@click.option("--brokers", default=3, show_default=True, type=click.IntRange(1, 100),
              help="How many brokers (ids 1..N).")
@click.option("--base-port", default=9092, show_default=True, type=click.IntRange(1, 65535),
              help="Broker N listens on base-port + N - 1.")
@click.option("--data-dir", default=Path("strom-cluster"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Brokers' data in DIR/broker-<id>, ZooKeeper's in DIR/zookeeper.")
@click.option("--zookeeper", "zookeeper_connect", metavar="HOST:PORT[/CHROOT]",
              help=f"Use this ZooKeeper instead of starting one (chroot {DEFAULT_CHROOT} if none given).")
@click.option("--zookeeper-port", default=2181, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the ZooKeeper started here, ZooKeeper's own default (0: any free port).")
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              callback=_parse_override, help="A broker config for every broker (repeatable).")
def up(brokers: int, base_port: int, data_dir: Path, zookeeper_connect: str | None,
       zookeeper_port: int, overrides: tuple[str, ...]) -> None:
    """Start ZooKeeper and the brokers; stop them all on Ctrl-C or SIGTERM."""
    if base_port + brokers - 1 > 65535:
        raise click.BadParameter("ports would run past 65535", param_hint="--base-port")
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())

    zookeeper: ZooKeeperServer | None = None
    if zookeeper_connect is None:
        problem = zookeeper_available()
        if problem:
            click.echo(f"strom: {problem}", err=True)
            sys.exit(1)
        if zookeeper_port and not _port_free(zookeeper_port):
            click.echo(f"strom: port {zookeeper_port} is in use (a ZooKeeper already running?): "
                       f"--zookeeper 127.0.0.1:{zookeeper_port} joins it, --zookeeper-port 0 picks "
                       "a free port", err=True)
            sys.exit(1)
        zookeeper = ZooKeeperServer(data_dir / "zookeeper", port=zookeeper_port)
        try:
            zookeeper.start()
        except RuntimeError as e:
            click.echo(f"strom: cannot start ZooKeeper: {str(e).splitlines()[0]} "
                       f"(log: {zookeeper.log_path})", err=True)
            zookeeper.stop()
            sys.exit(1)
        zookeeper_connect = zookeeper.connect + DEFAULT_CHROOT
    elif "/" not in zookeeper_connect:
        zookeeper_connect += DEFAULT_CHROOT

    started: list[_Broker] = []
    code = 0
    try:
        for broker_id in range(1, brokers + 1):
            started.append(_Broker(broker_id, base_port + broker_id - 1,
                                   data_dir / f"broker-{broker_id}", zookeeper_connect, overrides))
        failed = _wait_ready(started, stopping, timeout=120.0)
        if failed is not None:
            code = 1
            click.echo(f"strom: broker {failed.broker_id} did not start (log: {failed.log_path}):\n"
                       f"{failed.last_lines()}", err=True)
        elif not stopping.is_set():
            bootstrap = ",".join(f"127.0.0.1:{b.port}" for b in started)
            click.echo(f"cluster ready: bootstrap {bootstrap} (zookeeper {zookeeper_connect})")
            sys.stdout.flush()
            _watch(started, stopping)
    finally:
        click.echo("stopping the cluster", err=True)
        # All brokers at once (each shuts down cleanly on SIGTERM), then ZooKeeper, which the
        # brokers need while they shut down.
        threads = [threading.Thread(target=b.stop) for b in started]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if zookeeper is not None:
            zookeeper.stop()
    sys.exit(code)


def _port_free(port: int) -> bool:
    """Whether 127.0.0.1:`port` can be bound (else ZooKeeper would fail to, and another server
    answering there could pass for it)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no obstacle
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_ready(brokers: list[_Broker], stopping: threading.Event,
                timeout: float) -> _Broker | None:
    """The first broker that exited (or timed out) before it was ready, or None."""
    deadline = time.monotonic() + timeout
    while not stopping.is_set():
        pending = [b for b in brokers if not b.ready.is_set()]
        if not pending:
            return None
        for broker in pending:
            if broker.proc.poll() is not None or time.monotonic() > deadline:
                return broker
        time.sleep(0.1)
    return None


def _watch(brokers: list[_Broker], stopping: threading.Event) -> None:
    """Wait for Ctrl-C or SIGTERM, saying so when a broker exits by itself meanwhile."""
    reported: set[int] = set()
    while not stopping.wait(0.5):
        for broker in brokers:
            code = broker.proc.poll()
            if code is not None and broker.broker_id not in reported:
                reported.add(broker.broker_id)
                click.echo(f"strom: broker {broker.broker_id} exited with code {code} "
                           f"(log: {broker.log_path})", err=True)
