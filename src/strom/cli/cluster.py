"""`strom cluster up`: a cluster of N nodes on this machine, for development and trials.

By default the nodes are KRaft nodes in combined mode (process.roles=broker,controller), as
Kafka 4 runs them: node N has its broker listener on base-port + N - 1 and its controller
listener on controller-port + N - 1, and the N controllers are the static quorum
(controller.quorum.voters). Each node's directory is formatted as `strom storage format` formats
it, once: a restart on the same --data-dir keeps the directories, and so the cluster id (also
written to DIR/cluster-id, for the nodes a user adds). Neither Java nor ZooKeeper is needed.

With --zookeeper (or --zookeeper-port) the brokers keep their metadata in ZooKeeper instead:
one is started here unless --zookeeper names one.

Secure unless --insecure: the nodes reach each other only over SASL listeners (PLAIN, with a
password made for this cluster on its first start and kept in DIR/credentials.properties):
the inter-broker listener INTERNAL on internal-port + N - 1 and, on KRaft, the controller
listener. An authorizer is on with the nodes (and an admin user, DIR/admin.properties) as
super users; clients of the PLAINTEXT listener may do what a development cluster needs (topics,
groups, producing, consuming, describing), but not what only nodes or an administrator may:
ClusterAction (followers' fetches, the controller's requests), ACLs, SCRAM users, elections,
reassignments. In ZooKeeper mode the brokers also authenticate to ZooKeeper and keep their
znodes to themselves (zookeeper.set.acl). DIR/node-security.properties holds the settings a
node added by hand needs.

The tool supervises the nodes: one that exits while the cluster runs is started again after
1 s, 2 s, 4 s ... (at most 30 s; back to 1 s once it stayed up a minute), each time with one
line on stderr; --no-restart only reports it. Nodes a user added by hand under DIR (KRaft: a
broker's DIR/node-<id>/server.properties; ZooKeeper mode: DIR/broker-<id>) are started with the
others on the next start, after them, and stopped before them: every replica the cluster holds
comes back with it.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import click

from strom.config import broker as broker_config
from strom.controller.features import default_levels
from strom.metadata.storage import StorageError, format_storage, kafka_uuid, read_meta
from strom.zookeeper_server import ZooKeeperServer, zookeeper_available

DEFAULT_CHROOT = "/strom"
DEFAULT_ZOOKEEPER_PORT = 2181
CONTROLLER_PORT_OFFSET = 100  # controller N listens on base-port + 100 + N - 1 by default
INTERNAL_PORT_OFFSET = 200  # node N's inter-broker listener: base-port + 200 + N - 1 by default
CLUSTER_ID_FILE = "cluster-id"
CREDENTIALS_FILE = "credentials.properties"  # the passwords made on the first start (mode 0600)
SECURITY_FILE = "node-security.properties"  # what every node of a secure cluster is configured with
ADMIN_FILE = "admin.properties"  # a client's --command-config as the cluster's administrator
NODE_USER, ADMIN_USER = "strom-node", "strom-admin"
KRAFT_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ZOOKEEPER_AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
# What anyone on the PLAINTEXT listener may do on the cluster resource. An ACL on it also takes
# the cluster out of allow.everyone.if.no.acl.found, so ClusterAction (a forged follower's
# fetch, a controller's request) and Alter (ACLs, elections, reassignments) are the nodes' and
# the administrator's alone.
OPEN_CLUSTER_OPERATIONS = ("describe", "describeconfigs", "create", "idempotentwrite")
# A node that exits is started again after 1 s, 2 s, 4 s ... up to this, and after 1 s again
# once it stayed up STABLE_AFTER seconds.
MAX_RESTART_DELAY = 30.0
STABLE_AFTER = 60.0
GENERATED_HEADER = "# A combined KRaft node of `strom cluster up`, written at each start of the cluster."
# --zookeeper given without a value: start a ZooKeeper here.
_START_ZOOKEEPER = "here"


@click.group()
def cluster() -> None:
    """Run a Strom cluster on this machine."""


class _Node:
    """One `strom serve` child, started again when it exits if the cluster says so: its stdout
    and stderr go to <dir>/strom.log; the ready line it prints on stdout tells us it serves."""

    def __init__(self, kind: str, node_id: int, port: int | None, directory: Path, args: list[str]) -> None:
        self.kind, self.node_id, self.port, self.directory, self.args = kind, node_id, port, directory, args
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "strom.log"
        self._log = open(self.log_path, "a")  # noqa: SIM115 - closed when the node is stopped
        self.restarts = 0  # in a row, for the backoff
        self.restart_at: float | None = None  # when it is due to start again
        self.reported = False  # its exit was reported (--no-restart)
        self._start()

    def _start(self) -> None:
        self.started_at = time.monotonic()
        self.ready = threading.Event()  # this process's: a dead one's last lines cannot set it
        # A session of its own: Ctrl-C in the terminal reaches only us, and we decide how the
        # nodes stop.
        self.proc = subprocess.Popen([sys.executable, "-m", "strom", "serve", *self.args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, start_new_session=True)
        threading.Thread(target=self._copy_stdout, args=(self.proc.stdout, self.ready), daemon=True).start()

    def _copy_stdout(self, stdout: IO[str], ready: threading.Event) -> None:
        for line in stdout:
            try:
                self._log.write(line)
                self._log.flush()
            except ValueError:  # the log is closed: the node was stopped
                return
            if " ready on " in line:
                ready.set()

    def next_delay(self) -> float:
        """The wait before the next restart: doubling from 1 s, reset by a minute of service."""
        if time.monotonic() - self.started_at >= STABLE_AFTER:
            self.restarts = 0
        delay = min(MAX_RESTART_DELAY, 2.0 ** self.restarts)
        self.restarts += 1
        return delay

    def restart(self) -> None:
        self._log.write(f"strom cluster up: {self.kind} {self.node_id} exited with code "
                        f"{self.proc.returncode}, starting it again\n")
        self._log.flush()
        self._start()

    def last_lines(self, count: int = 5) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-count:])

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        self.terminate()
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


def _ports(first: int, count: int, option: str) -> list[int]:
    if first + count - 1 > 65535:
        raise click.BadParameter("ports would run past 65535", param_hint=option)
    return list(range(first, first + count))


@cluster.command()
@click.option("--brokers", default=3, show_default=True, type=click.IntRange(1, 100),
              help="How many nodes (ids 1..N).")
@click.option("--base-port", default=9092, show_default=True, type=click.IntRange(1, 65535),
              help="Node N's broker listener is on base-port + N - 1.")
@click.option("--controller-port", type=click.IntRange(1, 65535),
              help="KRaft: node N's controller listener is on this + N - 1 "
                   f"[default: base-port + {CONTROLLER_PORT_OFFSET}].")
@click.option("--data-dir", default=Path("strom-cluster"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Node N's data in DIR/node-<N> (KRaft) or DIR/broker-<N> (ZooKeeper mode), "
                   "ZooKeeper's in DIR/zookeeper.")
@click.option("--zookeeper", "zookeeper_connect", metavar="[HOST:PORT[/CHROOT]]",
              is_flag=False, flag_value=_START_ZOOKEEPER,
              help="ZooKeeper mode instead of KRaft: alone, start a ZooKeeper here; with an "
                   f"address, use that one (chroot {DEFAULT_CHROOT} if none given).")
@click.option("--zookeeper-port", type=click.IntRange(0, 65535),
              help="ZooKeeper mode: the port of the ZooKeeper started here (0: any free port) "
                   f"[default: {DEFAULT_ZOOKEEPER_PORT}, ZooKeeper's own].")
@click.option("--internal-port", type=click.IntRange(1, 65535),
              help="Node N's inter-broker listener (SASL) is on this + N - 1 "
                   f"[default: base-port + {INTERNAL_PORT_OFFSET}]; not with --insecure.")
@click.option("--insecure", is_flag=True,
              help="No credentials and no authorizer: the nodes reach each other over PLAINTEXT, "
                   "and whoever reaches a node's ports may act as a node.")
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              callback=_parse_override, help="A broker config for every node (repeatable).")
@click.option("--no-restart", is_flag=True,
              help="Report a node that exits, without starting it again (by default it is started "
                   f"again after 1 s, 2 s, 4 s ... up to {MAX_RESTART_DELAY:g} s).")
def up(brokers: int, base_port: int, controller_port: int | None, data_dir: Path,
       zookeeper_connect: str | None, zookeeper_port: int | None, internal_port: int | None,
       insecure: bool, overrides: tuple[str, ...], no_restart: bool) -> None:
    """Start the nodes (KRaft; with --zookeeper, ZooKeeper and brokers) and the ones added by
    hand under --data-dir, start again one that exits, stop them all on Ctrl-C or SIGTERM.

    \b
    Examples:
      strom cluster up --brokers 3
      strom cluster up --brokers 3 --base-port 19092 --data-dir /tmp/strom-cluster
      strom cluster up --brokers 3 --zookeeper
      strom cluster up --brokers 3 --zookeeper 127.0.0.1:2181/strom
      strom cluster up --brokers 3 --insecure
      strom cluster up --brokers 3 --no-restart
    """
    ports = _ports(base_port, brokers, "--base-port")
    zookeeper_mode = zookeeper_connect is not None or zookeeper_port is not None
    if zookeeper_mode and controller_port is not None:
        raise click.UsageError("--controller-port is for KRaft nodes, not ZooKeeper mode")
    if insecure and internal_port is not None:
        raise click.UsageError("--internal-port is the secure inter-broker listener's: not with --insecure")
    taken = set(ports)
    controller_ports: list[int] = []
    if not zookeeper_mode:
        controller_ports = _more_ports(base_port + CONTROLLER_PORT_OFFSET, controller_port, brokers,
                                       "--controller-port", "controller ports would overlap the broker ports", taken)
    security = None
    if not insecure:
        internal_ports = _more_ports(base_port + INTERNAL_PORT_OFFSET, internal_port, brokers, "--internal-port",
                                     "inter-broker ports would overlap the broker or controller ports", taken)
        data_dir.mkdir(parents=True, exist_ok=True)
        security = _Security(data_dir, internal_ports, kraft=not zookeeper_mode)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    if zookeeper_mode:
        _up_zookeeper(ports, data_dir, zookeeper_connect, zookeeper_port, overrides, stopping, security,
                      taken, not no_restart)
    else:
        _up_kraft(ports, controller_ports, data_dir, overrides, stopping, security, not no_restart)


def _more_ports(default: int, given: int | None, count: int, option: str, overlap: str, taken: set[int]) -> list[int]:
    """`count` ports from `given` (or `default`) that none of `taken` overlaps; added to it."""
    ports = _ports(default if given is None else given, count, option)
    if set(ports) & taken:
        raise click.BadParameter(overlap, param_hint=option)
    taken.update(ports)
    return ports


# --- security -----------------------------------------------------------------------------------

def _private_file(path: Path, text: str) -> None:
    """`text` in a file only its owner may read (it holds passwords)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # an older file keeps its mode through O_CREAT


class _Security:
    """The credentials of a secure cluster and the settings they make: made on the first start,
    kept in DIR/credentials.properties, the same on every later start."""

    def __init__(self, data_dir: Path, internal_ports: list[int], kraft: bool) -> None:
        self.data_dir, self.internal_ports, self.kraft = data_dir, internal_ports, kraft
        path = data_dir / CREDENTIALS_FILE
        known = broker_config.read_properties(path) if path.exists() else {}
        self.node_password = known.get("node.password") or secrets.token_urlsafe(24)
        self.admin_password = known.get("admin.password") or secrets.token_urlsafe(24)
        if known.get("node.password") != self.node_password or known.get("admin.password") != self.admin_password:
            _private_file(path, "# Passwords of this cluster's nodes and administrator, made by "
                                "`strom cluster up`.\n"
                                f"node.password={self.node_password}\nadmin.password={self.admin_password}\n")

    def settings(self) -> dict[str, str]:
        """What every node has (a node added by hand too, from DIR/node-security.properties)."""
        jaas = (f'org.apache.kafka.common.security.plain.PlainLoginModule required '
                f'username="{NODE_USER}" password="{self.node_password}" '
                f'user_{NODE_USER}="{self.node_password}" user_{ADMIN_USER}="{self.admin_password}";')
        settings = {
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_PLAINTEXT"
                                              + (",CONTROLLER:SASL_PLAINTEXT" if self.kraft else ""),
            "inter.broker.listener.name": "INTERNAL",
            "sasl.enabled.mechanisms": "PLAIN", "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.internal.plain.sasl.jaas.config": jaas,
            "authorizer.class.name": KRAFT_AUTHORIZER if self.kraft else ZOOKEEPER_AUTHORIZER,
            "super.users": f"User:{NODE_USER};User:{ADMIN_USER}",
            "allow.everyone.if.no.acl.found": "true",
        }
        if self.kraft:
            settings |= {"sasl.mechanism.controller.protocol": "PLAIN",
                         "listener.name.controller.plain.sasl.jaas.config": jaas}
        else:  # the brokers' znodes: changed (and the secret ones read) by the nodes alone
            settings |= {"zookeeper.set.acl": "true",
                         "zookeeper.digest.auth": f"{NODE_USER}:{self.node_password}"}
        return settings

    def internal_bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.internal_ports)

    def write_files(self) -> None:
        settings = "".join(f"{k}={v}\n" for k, v in self.settings().items())
        _private_file(self.data_dir / SECURITY_FILE,
                      "# The security settings of every node of this cluster (`strom cluster up`): a node\n"
                      "# added by hand takes them too, with an INTERNAL listener of its own.\n" + settings)
        _private_file(self.data_dir / ADMIN_FILE,
                      "# The cluster's administrator, for a client's --command-config (the INTERNAL listeners).\n"
                      f"bootstrap.servers={self.internal_bootstrap()}\n"
                      "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                      f"sasl.username={ADMIN_USER}\nsasl.password={self.admin_password}\n")

    def open_cluster_to_clients(self) -> None:
        """The cluster ACLs that let the PLAINTEXT listener's clients work (an ACL that exists
        is added again as a no-op)."""
        args = [sys.executable, "-m", "strom", "acls", "add", "--allow-principal", "User:*", "--cluster",
                *(arg for op in OPEN_CLUSTER_OPERATIONS for arg in ("--operation", op)),
                "--command-config", str(self.data_dir / ADMIN_FILE),
                "--bootstrap-server", self.internal_bootstrap()]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise click.ClickException(f"cannot add the cluster's ACLs: {done.stderr.strip()[-500:]}")


# --- KRaft --------------------------------------------------------------------------------------

def _kraft_settings(node_id: int, port: int, voters: str, controller_port: int,
                    directory: Path, count: int, security: _Security | None) -> dict[str, str]:
    settings = {
        "process.roles": "broker,controller", "node.id": str(node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "inter.broker.listener.name": "PLAINTEXT", "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(directory.resolve() / "logs"),
    }
    if security is not None:
        internal = f"INTERNAL://127.0.0.1:{security.internal_ports[node_id - 1]}"
        settings["listeners"] += "," + internal
        settings["advertised.listeners"] += "," + internal
        settings |= security.settings()
    if count < 3:  # the internal topics' default replication factor (3) needs three brokers
        settings.update({"offsets.topic.replication.factor": str(count),
                         "transaction.state.log.replication.factor": str(count),
                         "transaction.state.log.min.isr": str(min(count, 2)),
                         "share.coordinator.state.topic.replication.factor": str(count),
                         "share.coordinator.state.topic.min.isr": str(min(count, 2))})
    return settings


def _write_config(path: Path, settings: dict[str, str]) -> None:
    lines = [GENERATED_HEADER,
             *(f"{k}={v}" for k, v in settings.items())]
    _private_file(path, "\n".join(lines) + "\n")  # a secure cluster's holds its password


def _cluster_id(data_dir: Path, node_dirs: list[Path]) -> str:
    """The cluster id of the nodes formatted on an earlier start, or a new one."""
    found = set()
    for d in node_dirs:
        try:
            meta = read_meta(d / "logs")
        except StorageError as e:
            raise click.ClickException(str(e)) from None
        if meta is not None:
            found.add(meta.cluster_id)
    if len(found) > 1:
        raise click.ClickException(f"the nodes under {data_dir} belong to different clusters "
                                   f"({', '.join(sorted(found))}): use another --data-dir")
    return found.pop() if found else kafka_uuid()


def _format(config: Path, cluster_id: str, overrides: tuple[str, ...]) -> None:
    """Format the node's directories as `strom storage format` does (static quorum), leaving
    the ones formatted on an earlier start as they are."""
    try:
        cfg = broker_config.load(config, list(overrides))
        format_storage(cluster_id=cluster_id, node_id=cfg.broker_id, log_dirs=cfg.log_dirs,
                       metadata_dir=cfg.metadata_log_dir,
                       controller_listener=cfg.controller_listener_names[0],
                       features=default_levels(), ignore_formatted=True)
    except (broker_config.ConfigError, StorageError) as e:
        raise click.ClickException(f"cannot format {config.parent}: {e}") from None


def _up_kraft(ports: list[int], controller_ports: list[int], data_dir: Path, overrides: tuple[str, ...],
              stopping: threading.Event, security: _Security | None, restart: bool) -> None:
    ids = range(1, len(ports) + 1)
    dirs = [data_dir / f"node-{n}" for n in ids]
    voters = ",".join(f"{n}@127.0.0.1:{p}" for n, p in zip(ids, controller_ports, strict=True))
    cluster_id = _cluster_id(data_dir, dirs)
    configs = []
    for node_id, port, cport, d in zip(ids, ports, controller_ports, dirs, strict=True):
        d.mkdir(parents=True, exist_ok=True)
        config = d / "server.properties"
        _write_config(config, _kraft_settings(node_id, port, voters, cport, d, len(ports), security))
        _format(config, cluster_id, overrides)
        configs.append(config)
    (data_dir / CLUSTER_ID_FILE).write_text(cluster_id + "\n")
    if security is not None:
        security.write_files()
    extra = [arg for value in overrides for arg in ("--override", value)]
    controllers = ",".join(f"127.0.0.1:{p}" for p in controller_ports)
    _run([lambda i=i: _Node("node", i + 1, ports[i], dirs[i], [str(configs[i]), *extra])
          for i in range(len(ports))], _added_kraft_nodes(data_dir, len(ports), cluster_id, overrides),
         f"kraft, controllers {controllers}", stopping, security, restart)


def _numbered(data_dir: Path, prefix: str, count: int) -> list[tuple[int, Path]]:
    """DIR/<prefix><id> for the ids the cluster does not make itself (1..count), by id."""
    found = [(int(d.name[len(prefix):]), d) for d in data_dir.glob(prefix + "*")
             if d.is_dir() and d.name[len(prefix):].isdigit()]
    return sorted((n, d) for n, d in found if not 1 <= n <= count)


def _skip(directory: Path, why: str) -> None:
    click.echo(f"strom: not starting {directory}: {why}", err=True)


def _added_kraft_nodes(data_dir: Path, count: int, cluster_id: str, overrides: tuple[str, ...]) -> list:
    """Starters of the brokers added by hand (DIR/node-<id>/server.properties, as the README
    adds node-4), each checked as far as can be without starting it."""
    extra = [arg for value in overrides for arg in ("--override", value)]
    starters = []
    for node_id, d in _numbered(data_dir, "node-", count):
        config = d / "server.properties"
        if not config.is_file():
            continue
        if config.read_text(errors="replace").startswith(GENERATED_HEADER):
            _skip(d, f"a combined node of an earlier, larger cluster (--brokers {node_id} or more)")
            continue
        try:
            cfg = broker_config.load(config, list(overrides))
            meta = read_meta(cfg.metadata_log_dir)
        except (broker_config.ConfigError, StorageError) as e:
            _skip(d, str(e))
            continue
        if cfg.process_roles != ("broker",):
            _skip(d, "a node added by hand is started only if it is a broker (process.roles=broker)")
        elif meta is None:
            _skip(d, f"not formatted (strom storage format -t {cluster_id} -c {config})")
        elif meta.cluster_id != cluster_id:
            _skip(d, f"formatted for cluster {meta.cluster_id}, not this cluster's {cluster_id}")
        else:
            port = next((x.port for x in cfg.listeners if x.name == "PLAINTEXT"), None)
            starters.append(lambda n=cfg.broker_id, p=port, d=d, c=config: _Node("node", n, p, d, [str(c), *extra]))
    return starters


# --- ZooKeeper mode -----------------------------------------------------------------------------

def _up_zookeeper(ports: list[int], data_dir: Path, zookeeper_connect: str | None,
                  zookeeper_port: int | None, overrides: tuple[str, ...], stopping: threading.Event,
                  security: _Security | None, taken: set[int], restart: bool) -> None:
    zookeeper: ZooKeeperServer | None = None
    if zookeeper_connect in (None, _START_ZOOKEEPER):
        port = DEFAULT_ZOOKEEPER_PORT if zookeeper_port is None else zookeeper_port
        problem = zookeeper_available()
        if problem:
            click.echo(f"strom: {problem}", err=True)
            sys.exit(1)
        if port and not _port_free(port):
            click.echo(f"strom: port {port} is in use (a ZooKeeper already running?): "
                       f"--zookeeper 127.0.0.1:{port} joins it, --zookeeper-port 0 picks "
                       "a free port", err=True)
            sys.exit(1)
        zookeeper = ZooKeeperServer(data_dir / "zookeeper", port=port)
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

    config: list[str] = []
    if security is not None:  # the passwords go in a file, not in the nodes' command lines
        security.write_files()
        config = [str(data_dir / SECURITY_FILE)]

    def broker(broker_id: int, port: int, internal: int | None) -> _Node:
        directory = data_dir / f"broker-{broker_id}"
        listeners = f"PLAINTEXT://127.0.0.1:{port}"
        if internal is not None:
            listeners += f",INTERNAL://127.0.0.1:{internal}"
        settings = [f"broker.id={broker_id}", f"listeners={listeners}",
                    f"log.dirs={directory / 'logs'}", f"zookeeper.connect={zookeeper_connect}",
                    *overrides]
        args = [arg for setting in settings for arg in ("--override", setting)]
        return _Node("broker", broker_id, port, directory, config + args)

    def added(broker_id: int, directory: Path) -> _Node:
        own = directory / "server.properties"
        if own.is_file():  # as the user wrote it
            args = [str(own), *(arg for value in overrides for arg in ("--override", value))]
            return _Node("broker", broker_id, None, directory, args)
        # As the README adds broker-4: the ports the cluster would give a broker of that id.
        return broker(broker_id, ports[0] + broker_id - 1,
                      None if security is None else security.internal_ports[0] + broker_id - 1)

    hand = []  # a broker-<id> with data (the README's) or a server.properties of its own
    for broker_id, d in _numbered(data_dir, "broker-", len(ports)):
        derived = [ports[0] + broker_id - 1] + ([] if security is None else [security.internal_ports[0] + broker_id - 1])
        if not (d / "server.properties").is_file():
            if not (d / "logs").is_dir():
                continue
            if any(not 0 < p <= 65535 or p in taken for p in derived):
                _skip(d, f"broker {broker_id}'s ports ({', '.join(map(str, derived))}) are out of range or "
                         "the cluster's other ports")
                continue
        hand.append(lambda n=broker_id, d=d: added(n, d))

    try:
        _run([lambda n=n: broker(n, ports[n - 1], None if security is None else security.internal_ports[n - 1])
              for n in range(1, len(ports) + 1)], hand, f"zookeeper {zookeeper_connect}", stopping, security,
             restart)
    finally:
        # The brokers need ZooKeeper while they shut down: it goes last.
        if zookeeper is not None:
            zookeeper.stop()


# --- either mode --------------------------------------------------------------------------------

def _run(starters: list, added: list, mode: str, stopping: threading.Event, security: _Security | None,
         restart: bool) -> None:
    """Start the nodes, then the ones added by hand, say when they all serve, supervise them,
    and stop them all (the added ones first) on Ctrl-C or SIGTERM; exits 1 when a node did not
    start."""
    started: list[_Node] = []
    by_hand: list[_Node] = []
    code = 0
    try:
        for start in starters:
            started.append(start())
        failed = _wait_ready(started, stopping, timeout=120.0)
        if failed is None and added and not stopping.is_set():
            # Brokers: they join the quorum and the controllers the cluster made.
            for start in added:
                by_hand.append(start())
            failed = _wait_ready(by_hand, stopping, timeout=120.0)
        if failed is not None:
            code = 1
            click.echo(f"strom: {failed.kind} {failed.node_id} did not start (log: {failed.log_path}):\n"
                       f"{failed.last_lines()}", err=True)
        elif not stopping.is_set():
            if by_hand:
                mode += ", added by hand: " + ", ".join(f"{n.kind} {n.node_id}" for n in by_hand)
            if security is not None:
                security.open_cluster_to_clients()
                mode += f", secure: admin {security.data_dir / ADMIN_FILE}"
            else:
                mode += ", insecure"
            bootstrap = ",".join(f"127.0.0.1:{n.port}" for n in started)
            click.echo(f"cluster ready: bootstrap {bootstrap} ({mode})")
            sys.stdout.flush()
            _watch(started + by_hand, stopping, restart)
    finally:
        click.echo("stopping the cluster", err=True)
        _stop(by_hand)
        _stop(started)
    if code:
        sys.exit(code)


def _stop(nodes: list[_Node]) -> None:
    """All nodes at once, each shutting down cleanly on SIGTERM: every node keeps its part of
    the quorum (a combined node stops its broker before its controller) while the others hand
    their leadership on, and nobody waits for a node that already left."""
    for node in nodes:
        node.terminate()
    threads = [threading.Thread(target=n.stop) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


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


def _wait_ready(nodes: list[_Node], stopping: threading.Event, timeout: float) -> _Node | None:
    """The first node that exited (or timed out) before it was ready, or None."""
    deadline = time.monotonic() + timeout
    while not stopping.is_set():
        pending = [n for n in nodes if not n.ready.is_set()]
        if not pending:
            return None
        for node in pending:
            if node.proc.poll() is not None or time.monotonic() > deadline:
                return node
        time.sleep(0.1)
    return None


def _watch(nodes: list[_Node], stopping: threading.Event, restart: bool) -> None:
    """Until Ctrl-C or SIGTERM: a node that exits is reported in one line and, if `restart`,
    started again after its backoff."""
    while not stopping.wait(0.5):
        now = time.monotonic()
        for node in nodes:
            if node.restart_at is not None:
                if now >= node.restart_at:
                    node.restart_at = None
                    node.restart()
                continue
            code = node.proc.poll()
            if code is None or node.reported:
                continue
            if code < 0:
                code_text = f"{code} ({signal.Signals(-code).name})" if -code in signal.valid_signals() else str(code)
            else:
                code_text = str(code)
            line = f"strom: {node.kind} {node.node_id} exited with code {code_text} (log: {node.log_path})"
            if restart:
                delay = node.next_delay()
                node.restart_at = now + delay
                line += f"; starting it again in {delay:g} s"
            else:
                node.reported = True
            click.echo(line, err=True)
