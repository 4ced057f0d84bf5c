"""What every `strom` client command shares: one `--bootstrap-server` with one default,
`--command-config` for a client properties file, one connection layer over the Kafka protocol,
and one way to fail (a single line on stderr and a non-zero exit code).

Exit codes, the same for every command: 0 success; 1 the operation failed (the cluster refused
it, could not be reached, or a check found problems); 2 the command line itself is wrong.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
import kafka.errors

from strom.client import AuthenticationError, ClientSecurity, Connection
from strom.jaas import parse_jaas
from strom.protocol.errors import ErrorCode

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"  # where `strom serve` listens by default
DEFAULT_TIMEOUT_MS = 30_000  # request.timeout.ms, as Kafka's clients default it
CLIENT_ID = "strom-cli"

METADATA, LIST_OFFSETS, FIND_COORDINATOR = 3, 2, 10
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
CONTROLLER_WAIT_S = 15.0  # how long to look for a controller that accepts a request
# Errors after which the same request, asked again after fresh metadata, usually succeeds.
RETRIABLE = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
             ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
             ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
             ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}

TopicPartition = tuple[str, int]
R = TypeVar("R")  # what Cluster.at_leaders gives per partition


class CommandError(click.ClickException):
    """A failure shown as one line on stderr ("Error: ..."), exit code 1."""


def error_name(code: int) -> str:
    """Kafka's name of an error code (UNKNOWN_TOPIC_OR_PARTITION, ...)."""
    try:
        return ErrorCode(code).name
    except ValueError:
        cls = kafka.errors.for_code(code)
        return getattr(cls, "message", None) or f"error {code}"


# Kafka's own words (Errors.java) where kafka-python's description misleads: a lost controller
# quorum answers NOT_LEADER_OR_FOLLOWER for __cluster_metadata, which is not "the client's
# metadata is out of date", and a request a broker could not forward times out.
DESCRIPTIONS = {
    ErrorCode.LEADER_NOT_AVAILABLE: "There is no leader for this topic-partition as we are in the middle of a "
                                    "leadership election.",
    ErrorCode.NOT_LEADER_OR_FOLLOWER: "For requests intended only for the leader, this error indicates that the "
                                      "broker is not the current leader. For requests intended for any replica, this "
                                      "error indicates that the broker is not a replica of the topic partition.",
    ErrorCode.REQUEST_TIMED_OUT: "The request timed out.",
    ErrorCode.BROKER_NOT_AVAILABLE: "The broker is not available.",
}


def error_text(code: int, message: str | None = None) -> str:
    """An error code as a person reads it: its name and what the broker or Kafka says of it."""
    detail = message or DESCRIPTIONS.get(code) or getattr(kafka.errors.for_code(code), "description", "")
    return f"{error_name(code)}: {detail}" if detail else error_name(code)


def os_reason(e: OSError) -> str:
    """"connection refused" rather than "[Errno 111] Connection refused"."""
    if isinstance(e, TimeoutError):
        return "timed out"
    text = e.strerror or str(e) or type(e).__name__
    return text[0].lower() + text[1:]


# --- options ------------------------------------------------------------------------------------
def parse_servers(text: str) -> list[tuple[str, int]]:
    """`host:port[,host:port...]` ([v6]:port for IPv6 addresses)."""
    servers = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise click.BadParameter(f"expected host:port[,host:port...], got {text!r}",
                                     param_hint="'--bootstrap-server'")
        servers.append((host.strip("[]"), int(port)))
    if not servers:
        raise click.BadParameter("expected host:port[,host:port...]", param_hint="'--bootstrap-server'")
    return servers


def read_properties(path: Path) -> dict[str, str]:
    """A Java properties file, as `strom serve` reads its own."""
    from strom.config.broker import ConfigError
    from strom.config.broker import read_properties as read

    try:
        return read(path)
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="'--command-config'") from None
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"cannot read {path}: {getattr(e, 'strerror', None) or e}",
                                 param_hint="'--command-config'") from None


def parse_key_values(values: Iterable[str], option: str) -> dict[str, str]:
    """Repeated `KEY=VALUE` options; the value is everything after the first `=`."""
    out = {}
    for value in values:
        key, sep, v = value.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {value!r}", param_hint=f"'{option}'")
        out[key.strip()] = v
    return out


@dataclass
class ClientSettings:
    """Where the cluster is and the client properties to reach it with."""

    servers: list[tuple[str, int]]
    properties: dict[str, str]

    @property
    def client_id(self) -> str:
        return self.properties.get("client.id", CLIENT_ID)

    @property
    def timeout_s(self) -> float:
        try:
            return int(self.properties.get("request.timeout.ms", DEFAULT_TIMEOUT_MS)) / 1000
        except ValueError:
            raise click.BadParameter("request.timeout.ms must be a number of milliseconds",
                                     param_hint="'--command-config'") from None

    @functools.cached_property
    def security(self) -> ClientSecurity | None:
        """TLS and SASL from the properties (security.protocol, ssl.*, sasl.*), as Kafka's tools
        read them from --command-config."""
        try:
            return ClientSecurity.from_properties(self.properties)
        except (ValueError, OSError) as e:
            raise CommandError(f"--command-config: {e}") from None

    def kafka_python_config(self, known: Mapping[str, Any], *, fallback: Mapping[str, str] = {},
                            extra: Mapping[str, str] = {}) -> dict[str, Any]:
        """kafka-python keyword arguments (its `known` DEFAULT_CONFIG) from Kafka client
        properties: `fallback` (the command's own defaults), then the properties file, then
        `extra` (command-line properties) win. Dotted names become kafka-python's underscored
        ones; values take the type of kafka-python's default. Properties kafka-python does not
        know are named on stderr and left out."""
        props = _kafka_python_security({**fallback, **self.properties, **extra})
        props.pop("bootstrap.servers", None)  # from --bootstrap-server (or the file) already
        out: dict[str, Any] = {"bootstrap_servers": [f"{h}:{p}" for h, p in self.servers]}
        unknown = []
        for key, text in props.items():
            name = key.replace(".", "_")
            default = known.get(name)
            if name not in known or not isinstance(default, str | int | float | bool | None):
                unknown.append(key)
                continue
            out[name] = _typed(key, text.strip(), default)
        if unknown:
            click.echo(f"Warning: ignoring client properties this client does not know: "
                       f"{', '.join(sorted(unknown))}", err=True)
        return out


# Kafka's (and librdkafka's) security property names -> kafka-python's, for the same settings.
_SECURITY_NAMES = {"ssl.truststore.location": "ssl.cafile", "ssl.ca.location": "ssl.cafile",
                   "ssl.keystore.location": "ssl.certfile", "ssl.certificate.location": "ssl.certfile",
                   "ssl.key.location": "ssl.keyfile", "ssl.key.password": "ssl.password",
                   "sasl.mechanisms": "sasl.mechanism", "sasl.username": "sasl.plain.username",
                   "sasl.password": "sasl.plain.password"}


def _kafka_python_security(props: dict[str, str]) -> dict[str, str]:
    out = {_SECURITY_NAMES.get(k, k): v for k, v in props.items()
           if k not in ("sasl.jaas.config", "ssl.endpoint.identification.algorithm", "ssl.keystore.type",
                        "ssl.truststore.type")}
    if props.get("sasl.jaas.config"):
        options = parse_jaas(props["sasl.jaas.config"])
        out.update({"sasl.plain.username": options.get("username", ""), "sasl.plain.password": options.get("password", "")})
    if props.get("ssl.endpoint.identification.algorithm", "https").strip() == "":
        out["ssl.check.hostname"] = "false"
    return out


def _typed(key: str, text: str, default: Any) -> Any:
    if default is None:  # no default to learn the type from: sizes and times are numbers
        numeric = key.endswith((".bytes", ".ms")) and re.fullmatch(r"-?\d+", text)
        return int(text) if numeric else text
    if isinstance(default, bool):
        if text.lower() not in ("true", "false"):
            raise click.BadParameter(f"{key} must be true or false, got {text!r}")
        return text.lower() == "true"
    if isinstance(default, int | float) and not (key == "acks" and text == "all"):
        try:
            return int(text)
        except ValueError:
            raise click.BadParameter(f"{key} must be a number, got {text!r}") from None
    return text


def client_options(*config_aliases: str) -> Callable[[Callable], Callable]:
    """`--bootstrap-server` and `--command-config` (plus aliases such as Kafka's
    `--producer.config`), handed to the command as one `client: ClientSettings` argument.

    The bootstrap servers come from `--bootstrap-server`, else from `bootstrap.servers` in the
    properties file, else the default."""

    def decorate(f: Callable) -> Callable:
        @click.option("--bootstrap-server", "bootstrap", default=DEFAULT_BOOTSTRAP,
                      show_default=True, metavar="HOST:PORT[,...]",
                      help="Brokers to start from (the first that answers is used).")
        @click.option("--command-config", *config_aliases, "command_config", metavar="FILE",
                      type=click.Path(exists=True, dir_okay=False, path_type=Path),
                      help="Client properties (client.id, request.timeout.ms, ...) in Java "
                           "properties format.")
        @functools.wraps(f)
        def wrapper(bootstrap: str, command_config: Path | None, **kwargs: Any) -> Any:
            properties = read_properties(command_config) if command_config else {}
            source = click.get_current_context().get_parameter_source("bootstrap")
            if source == click.core.ParameterSource.DEFAULT and properties.get("bootstrap.servers"):
                bootstrap = properties["bootstrap.servers"]
            return f(client=ClientSettings(parse_servers(bootstrap), properties), **kwargs)

        return wrapper

    return decorate


# --- one-line failures --------------------------------------------------------------------------
class _OneLineErrors:
    """Connection and file errors that escape a command become one line and exit code 1,
    not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except BrokenPipeError:
            raise  # the reader went away (`| head`): handled by the command or by Python
        except OSError as e:
            where = f"{e.filename}: " if getattr(e, "filename", None) else ""
            raise CommandError(f"{where}{os_reason(e)}") from None
        except kafka.errors.KafkaError as e:
            raise CommandError(kafka_error_text(e)) from None


def kafka_error_text(e: kafka.errors.KafkaError) -> str:
    """A kafka-python error in one line: its class name and what it says."""
    name = type(e).__name__
    return f"{name}: {e}" if str(e) and str(e) != name else name


class Group(_OneLineErrors, click.Group):
    """A command group whose subcommands fail in one line."""


class Command(_OneLineErrors, click.Command):
    """A command that fails in one line."""


class KafkaToolGroup(Group):
    """A group whose subcommand may also be named as Kafka's own tool names its action: a flag
    anywhere on the line (`strom topics --create --topic t`, `strom acls --add ...`), so that an
    operator's kafka-*.sh lines work with only the script's name changed. `action_flags` maps
    the flags to subcommands; `kafka_line` rewrites the rest of such a line into the
    subcommand's own options where Kafka's differ."""

    action_flags: dict[str, str] = {}

    def kafka_line(self, command: str, args: list[str]) -> list[str]:
        return args

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        flags = [a for a in args if a in self.action_flags]
        if flags and not (args and args[0] in self.commands):
            if len(flags) > 1:
                raise click.UsageError(f"only one of {', '.join(self.action_flags)} may be given", ctx)
            rest = list(args)
            rest.remove(flags[0])
            command = self.action_flags[flags[0]]
            args = [command, *self.kafka_line(command, rest)]
        return super().parse_args(ctx, args)


def take_option(args: list[str], name: str) -> tuple[list[str], list[str]]:
    """`args` without every `name VALUE` (or `name=VALUE`), and those values."""
    rest, values = [], []
    it = iter(args)
    for arg in it:
        if arg == name:
            values.append(next(it, ""))
        elif arg.startswith(name + "="):
            values.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return rest, values


# --- connections --------------------------------------------------------------------------------
class BrokerConnection(Connection):
    """One connection to one broker whose failures are CommandErrors naming the broker."""

    def __init__(self, host: str, port: int, settings: ClientSettings) -> None:
        self.address = f"{host}:{port}"
        self.timeout_s = settings.timeout_s
        try:
            super().__init__(host, port, timeout_s=settings.timeout_s, client_id=settings.client_id,
                             security=settings.security)
        except AuthenticationError as e:
            raise CommandError(f"authentication with {self.address} failed: {e}") from None
        except OSError as e:
            raise CommandError(f"cannot connect to {self.address}: {os_reason(e)}") from None

    def call(self, api_key: int, version: int, fields: dict[str, Any],
             timeout_s: float | None = None) -> Any:
        """One request; `timeout_s` for a request the broker may hold longer than usual."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        try:
            self.sock.settimeout(wait)
            return super().call(api_key, version, fields)
        except TimeoutError:
            raise CommandError(f"{self.address} did not answer within {wait:g} s") from None
        except OSError as e:  # ConnectionError included
            raise CommandError(f"lost the connection to {self.address}: {os_reason(e)}") from None


@dataclass(frozen=True)
class ListedOffset:
    """One partition's ListOffsets answer: offset -1 when no record matched a timestamp."""

    error_code: int
    offset: int = -1
    timestamp: int = -1


class Cluster:
    """Connections to the brokers of one cluster, opened on demand: the first bootstrap server
    that accepts a connection answers metadata, and requests go where Kafka's clients send
    them (partition leaders, group coordinators, the controller)."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.connections: dict[tuple[str, int], BrokerConnection] = {}
        self.brokers: dict[int, tuple[str, int]] = {}
        failure: CommandError | None = None
        for host, port in settings.servers:
            try:
                self.bootstrap = self.connection(host, port)
                break
            except CommandError as e:
                failure = e
        else:
            assert failure is not None
            raise failure

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection(self, host: str, port: int) -> BrokerConnection:
        if (host, port) not in self.connections:
            self.connections[(host, port)] = BrokerConnection(host, port, self.settings)
        return self.connections[(host, port)]

    def broker(self, node_id: int) -> BrokerConnection:
        return self.connection(*self.brokers[node_id])

    def call(self, api_key: int, version: int, fields: dict[str, Any]) -> Any:
        """A request to the bootstrap server."""
        return self.bootstrap.call(api_key, version, fields)

    def metadata(self, topics: Iterable[str] | None) -> Any:
        """Metadata v12 (topic ids, live brokers, the controller) of `topics` (None: all),
        never creating a topic."""
        body = self.call(METADATA, 12, {
            "topics": None if topics is None else [{"name": t} for t in topics],
            "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
        self.brokers = {b.node_id: (b.host, b.port) for b in body.brokers}
        return body

    def all_brokers(self) -> list[BrokerConnection]:
        self.metadata([])
        return [self.connection(*address) for _, address in sorted(self.brokers.items())]

    def partitions(self, topics: Iterable[str]) -> dict[str, list[int]]:
        """The partition numbers of each topic; a missing topic is a CommandError."""
        out = {}
        for t in self.metadata(sorted(set(topics))).topics:
            if t.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise CommandError(f"Topic '{t.name}' does not exist.")
            if t.error_code != ErrorCode.NONE:
                raise CommandError(f"describing topic '{t.name}' failed: {error_name(t.error_code)}")
            out[t.name] = sorted(p.partition_index for p in t.partitions)
        return out

    def coordinator(self, group: str) -> tuple[int, BrokerConnection]:
        """The group's coordinator, asked again while it is still loading or moving."""
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            body = self.call(FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
            if body.error_code == ErrorCode.NONE:
                self.brokers[body.node_id] = (body.host, body.port)
                return body.node_id, self.connection(body.host, body.port)
            if body.error_code not in RETRIABLE or time.monotonic() > deadline:
                raise CommandError(f"cannot find the coordinator of group {group!r}: "
                                   f"{error_name(body.error_code)}")
            time.sleep(0.2)

    def at_controller(self, api_key: int, version: int, fields: dict, result: Callable[[Any], Any]) -> Any:
        """Send an admin request to the controller and return `result(body)`, the entry that
        carries its error code; asked again while no broker is the controller or the one asked
        no longer is, as Kafka's admin client does."""
        deadline = time.monotonic() + CONTROLLER_WAIT_S
        # The controller may take the request's own timeout_ms before it answers.
        wait = self.settings.timeout_s + fields.get("timeout_ms", 0) / 1000
        while True:
            controller = self.metadata([]).controller_id
            if controller in self.brokers:
                entry = result(self.broker(controller).call(api_key, version, fields, wait))
                if entry.error_code != ErrorCode.NOT_CONTROLLER:
                    return entry
            if time.monotonic() > deadline:
                raise CommandError(f"no controller accepted the request in {CONTROLLER_WAIT_S:g} s (controller id "
                                   f"{controller}): no broker is the controller now or, in a KRaft cluster, the "
                                   "controller quorum has no leader (a majority of the controllers down?)")
            time.sleep(0.5)

    def at_leaders(self, wanted: Mapping[TopicPartition, Any], entry: Callable[[TopicPartition, Any], dict],
                   call: Callable[[BrokerConnection, list[dict]], Any], answer: Callable[[Any], R],
                   failed: Callable[[int], R], error: Callable[[R], int]) -> dict[TopicPartition, R]:
        """One request per leader for the partitions of `wanted`: each partition's fields from
        `entry`, grouped by topic, sent by `call`; `answer` turns each partition of the responses
        into a result (`failed(code)` where no request could be sent). Partitions whose leader
        moved (a RETRIABLE `error`) are asked again after fresh metadata, a few times, as Kafka's
        admin client does."""
        out: dict[TopicPartition, R] = {}
        pending = dict(wanted)
        for attempt in range(5):
            if not pending:
                break
            if attempt:
                time.sleep(0.2 * attempt)
            meta = self.metadata(sorted({t for t, _ in pending}))
            leaders = {(t.name, p.partition_index): p.leader_id for t in meta.topics
                       for p in t.partitions if t.error_code == ErrorCode.NONE}
            by_leader: dict[int, dict[str, list[dict]]] = {}
            for tp, value in sorted(pending.items()):
                leader = leaders.get(tp)
                if leader is None:
                    out[tp] = failed(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                elif leader not in self.brokers:
                    out[tp] = failed(ErrorCode.LEADER_NOT_AVAILABLE)
                else:
                    by_leader.setdefault(leader, {}).setdefault(tp[0], []).append(entry(tp, value))
            for leader, topics in by_leader.items():
                body = call(self.broker(leader), [{"name": t, "partitions": ps} for t, ps in topics.items()])
                for t in body.topics:
                    for p in t.partitions:
                        out[(t.name, p.partition_index)] = answer(p)
            pending = {tp: v for tp, v in pending.items() if error(out[tp]) in RETRIABLE}
        return out

    def list_offsets(self, wanted: Mapping[TopicPartition, int], read_committed: bool = False,
                     version: int = 7) -> dict[TopicPartition, ListedOffset]:
        """ListOffsets at each partition's leader: `wanted` maps a partition to LATEST,
        EARLIEST, MAX_TIMESTAMP or a timestamp in ms (and with version 8, EARLIEST_LOCAL: a
        tiered log's first local offset)."""
        return self.at_leaders(
            wanted, lambda tp, timestamp: {"partition_index": tp[1], "current_leader_epoch": -1, "timestamp": timestamp},
            lambda conn, topics: conn.call(LIST_OFFSETS, version, {
                "replica_id": -1, "isolation_level": 1 if read_committed else 0, "topics": topics}),
            lambda p: ListedOffset(p.error_code, p.offset, p.timestamp), ListedOffset, lambda r: r.error_code)

    def close(self) -> None:
        for conn in self.connections.values():
            conn.close()


# --- shared parsing and output ------------------------------------------------------------------
def parse_topic_partitions(spec: str) -> tuple[str, list[int] | None]:
    """`topic` (every partition: None) or `topic:0,1,4-6`, as Kafka's tools write them."""
    topic, sep, parts = spec.rpartition(":")
    if not sep:
        return spec, None
    if not topic:
        raise click.BadParameter(f"expected TOPIC or TOPIC:PARTITION,..., got {spec!r}")
    partitions: list[int] = []
    for item in parts.split(","):
        first, dash, last = item.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise click.BadParameter(f"invalid partition {item!r} in {spec!r}") from None
        if low < 0 or high < low:
            raise click.BadParameter(f"invalid partition range {item!r} in {spec!r}")
        partitions.extend(range(low, high + 1))
    return topic, sorted(set(partitions))


def resolve_partitions(cluster: Cluster, specs: Iterable[str]) -> list[TopicPartition]:
    """The partitions `specs` name (see parse_topic_partitions); a topic or partition that does
    not exist is a CommandError."""
    parsed = [parse_topic_partitions(s) for s in specs]
    existing = cluster.partitions(t for t, _ in parsed)
    out: set[TopicPartition] = set()
    for topic, partitions in parsed:
        missing = sorted(set(partitions or ()) - set(existing[topic]))
        if missing:
            raise CommandError(f"Partition(s) {','.join(map(str, missing))} of topic '{topic}' "
                               "do not exist.")
        out.update((topic, p) for p in (existing[topic] if partitions is None else partitions))
    return sorted(out)


def parse_timestamp(text: str) -> int:
    """Milliseconds since the epoch from a number or an ISO-8601 date-time (a time without a
    zone is local time, as Kafka's tools read it)."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"expected milliseconds since the epoch or a date-time such as "
                                 f"2024-05-01T12:00:00.000+02:00, got {text!r}") from None
    if when.tzinfo is None:
        when = when.astimezone()
    return int(when.timestamp() * 1000)


_DURATION = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", re.IGNORECASE)


def parse_duration_ms(text: str) -> int:
    """An ISO-8601 duration as Java's Duration.parse reads it (PnDTnHnMn.nS) in ms."""
    m = _DURATION.fullmatch(text.strip())
    if not m or not any(m.groups()) or text.strip().upper().endswith("T"):
        raise click.BadParameter(f"expected a duration such as P1DT2H30M or PT15M, got {text!r}")
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in m.groups())
    return int(((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000)


def table(rows: list[list[Any]]) -> str:
    """Left-aligned columns two spaces apart, the first row a header."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


# --- record payloads in JSON lines (strom produce / strom consume --format json) -----------------
def bytes_to_json(data: bytes | None) -> str | dict | None:
    """A key, value or header value as JSON: text when it is UTF-8, else {"base64": ...}."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def json_to_bytes(value: Any, what: str) -> bytes | None:
    """The inverse of bytes_to_json; ValueError naming `what` for anything else."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and set(value) == {"base64"} and isinstance(value["base64"], str):
        try:
            return base64.b64decode(value["base64"], validate=True)
        except ValueError:
            raise ValueError(f"{what}: invalid base64") from None
    raise ValueError(f"{what} must be a string, null or {{\"base64\": \"...\"}}")
