"""`strom storage random-uuid|format|info`: a KRaft node's storage, as Kafka 4's
`kafka-storage.sh` prepares it.

    strom storage random-uuid
    strom storage format --cluster-id ID --config server.properties --standalone
    strom storage format -t ID -c server.properties --initial-controllers 1@host:9093:DIRID,...
    strom storage format -t ID -c server.properties --no-initial-controllers
    strom storage info -c server.properties

A node with process.roles set refuses to start until its directories are formatted.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import click

from strom.cli.api_versions import default_levels_at
from strom.cli.common import CommandError, Group
from strom.config import broker as broker_config
from strom.controller.features import SUPPORTED
from strom.log.manager import read_properties
from strom.metadata.storage import (
    META_PROPERTIES,
    InitialController,
    StorageError,
    format_storage,
    kafka_uuid,
    parse_initial_controllers,
    parse_kafka_uuid,
    storage_dirs,
)

# metadata.version levels of the Kafka releases a --release-version may name (Kafka's
# MetadataVersion: the latest IV of each release).
RELEASES = {"3.3": 7, "3.4": 8, "3.5": 11, "3.6": 14, "3.7": 19, "3.8": 20, "3.9": 21, "4.0": 25}


@click.group(cls=Group)
def storage() -> None:
    """Format and inspect a KRaft node's directories (like kafka-storage.sh)."""


@storage.command("random-uuid")
def random_uuid() -> None:
    """Print a new cluster id (Kafka's Uuid text form)."""
    click.echo(kafka_uuid())


def _load(config: Path, overrides: tuple[str, ...]) -> broker_config.BrokerConfig:
    try:
        cfg = broker_config.load(config, list(overrides))
    except broker_config.ConfigError as e:
        raise CommandError(str(e)) from None
    if not cfg.process_roles:
        raise CommandError(f"{config} does not set process.roles: only KRaft nodes are formatted "
                           "(a ZooKeeper-mode or embedded broker formats its directories itself)")
    return cfg


def _features(release: str | None, pairs: tuple[str, ...]) -> dict[str, int]:
    levels = {name: f.default_level for name, f in SUPPORTED.items()}
    if release is not None:
        if release not in RELEASES:
            raise CommandError(f"--release-version {release} is not one of {', '.join(RELEASES)}")
        levels["metadata.version"] = RELEASES[release]
        levels.update(default_levels_at(RELEASES[release]))  # as Kafka's formatter: the release's defaults
    for pair in pairs:
        name, sep, level = pair.partition("=")
        if not sep or not level.strip().isdigit():
            raise CommandError(f"--feature expects name=level, got {pair!r}")
        if name not in SUPPORTED:
            raise CommandError(f"unknown feature {name!r}; known: {', '.join(sorted(SUPPORTED))}")
        f = SUPPORTED[name]
        if not (int(level) == 0 or f.min_level <= int(level) <= f.max_level):
            raise CommandError(f"{name}={level} is outside {f.min_level}..{f.max_level}")
        levels[name] = int(level)
    return levels


@storage.command("format")
@click.option("--cluster-id", "-t", required=True, help="The cluster's id (strom storage random-uuid).")
@click.option("--config", "-c", "config", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The node's server.properties.")
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE", help="As `strom serve --override`.")
@click.option("--standalone", "-s", is_flag=True,
              help="A dynamic quorum (KIP-853) whose only voter is this controller.")
@click.option("--initial-controllers", "-I", metavar="ID@HOST:PORT:DIRID,...",
              help="The first voters of a dynamic quorum; this controller's directory gets its DIRID.")
@click.option("--no-initial-controllers", "-N", is_flag=True,
              help="A controller that joins an existing dynamic quorum later (add-controller).")
@click.option("--release-version", "-r", help="The metadata.version of a Kafka release (3.3 ... 4.0).")
@click.option("--feature", "-f", "features", multiple=True, metavar="NAME=LEVEL",
              help="A finalized feature level, e.g. group.version=1 (repeatable).")
@click.option("--ignore-formatted", "-g", is_flag=True, help="Format the unformatted directories, keep the others.")
def format_(cluster_id: str, config: Path, overrides: tuple[str, ...], standalone: bool,
            initial_controllers: str | None, no_initial_controllers: bool, release_version: str | None,
            features: tuple[str, ...], ignore_formatted: bool) -> None:
    """Write meta.properties (version 1: node.id, cluster.id, directory.id) and the bootstrap
    checkpoint (feature levels) into every log dir and metadata.log.dir, and for a dynamic quorum
    the first voter set into __cluster_metadata-0.

    \b
    Examples:
      strom storage format -t $(strom storage random-uuid) -c controller.properties --standalone
      strom storage format -t ID -c server.properties          # static controller.quorum.voters
    """
    cfg = _load(config, overrides)
    chosen = sum(bool(x) for x in (standalone, initial_controllers, no_initial_controllers))
    if chosen > 1:
        raise CommandError("--standalone, --initial-controllers and --no-initial-controllers exclude each other")
    is_controller = "controller" in cfg.process_roles
    static = bool(cfg["controller.quorum.voters"])
    if chosen and not is_controller:
        raise CommandError("--standalone, --initial-controllers and --no-initial-controllers are for controllers")
    if chosen and static:
        raise CommandError("controller.quorum.voters is set (a static quorum): leave out --standalone, "
                           "--initial-controllers and --no-initial-controllers")
    if is_controller and not static and not chosen:
        raise CommandError("a dynamic quorum (controller.quorum.bootstrap.servers) needs --standalone, "
                           "--initial-controllers or --no-initial-controllers")
    controllers: list[InitialController] | None = None
    listener = cfg.controller_listener_names[0]
    try:
        if standalone:
            controllers = [_this_controller(cfg, listener)]
        elif initial_controllers:
            controllers = parse_initial_controllers(initial_controllers)
        lines = format_storage(cluster_id=cluster_id, node_id=cfg.broker_id, log_dirs=cfg.log_dirs,
                               metadata_dir=cfg.metadata_log_dir, controller_listener=listener,
                               features=_features(release_version, features), initial_controllers=controllers,
                               ignore_formatted=ignore_formatted)
    except StorageError as e:
        raise CommandError(str(e)) from None
    for line in lines:
        click.echo(line)


def _this_controller(cfg: broker_config.BrokerConfig, listener: str) -> InitialController:
    advertised = {x.name: x for x in cfg["advertised.listeners"] or []}
    chosen = advertised.get(listener) or next(x for x in cfg.listeners if x.name == listener)
    if not chosen.port:
        raise CommandError(f"--standalone: the controller listener {chosen} needs a fixed port (voters are "
                           "found at the address formatted into the quorum)")
    return InitialController(cfg.broker_id, chosen.host or "localhost", chosen.port, uuid.uuid4())


@storage.command("info")
@click.option("--config", "-c", "config", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def info(config: Path) -> None:
    """Print the log directories found, their meta.properties and any problem, as
    kafka-storage.sh info prints them; the exit code is 1 when a problem is found.

    \b
    Found log directory:
      /var/lib/strom

    \b
    Found metadata: {cluster.id=QW04la-GT-6IlGOw0CSKJQ, directory.id=..., node.id=1, version=1}
    """
    cfg = _load(config, ())
    # Kafka's order: the distinct directories sorted as text.
    dirs = sorted({str(d) for d in storage_dirs(cfg.log_dirs, cfg.metadata_log_dir)})
    lines, code = info_lines(dirs)
    for line in lines:
        click.echo(line)
    raise SystemExit(code)


def info_lines(directories: list[str]) -> tuple[list[str], int]:
    """kafka-storage.sh info's report on `directories` (a KRaft node's): its lines and exit code."""
    if not directories:
        return ["No directories specified."], 0
    problems: list[str] = []
    found: list[str] = []
    first: dict[str, str] | None = None
    for text in directories:
        d = Path(text)
        if not d.is_dir():
            problems.append(f"{d} is not a directory" if d.exists() else f"{d} does not exist")
            continue
        found.append(str(d))
        meta_path = d / META_PROPERTIES
        if not meta_path.exists():
            problems.append(f"{d} is not formatted.")
            continue
        try:
            meta = _meta_properties(meta_path)
        except (OSError, ValueError) as e:
            problems.append(f"Error loading {meta_path}: {e}")
            continue
        if first is None:
            first = meta
        elif first.get("cluster.id") != meta.get("cluster.id"):
            problems.append("Mismatched cluster IDs between storage directories.")
        elif _node(first) != _node(meta):
            problems.append("Mismatched node IDs between storage directories.")
    if first is not None and first["version"] == "0":
        problems.append("The kafka configuration file appears to be for a cluster in KRaft mode, but "
                        "the directories are formatted for legacy mode.")
    lines: list[str] = []
    if found:
        lines += ["Found log directory:" if len(found) == 1 else "Found log directories:",
                  *(f"  {d}" for d in found), ""]
    if first is not None:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(first.items()))
        lines += [f"Found metadata: {{{shown}}}", ""]
    if problems:
        lines += ["Found problem:" if len(problems) == 1 else "Found problems:", *(f"  {p}" for p in problems), ""]
    return lines, 1 if problems else 0


def _node(meta: dict[str, str]) -> str | None:
    return meta.get("node.id", meta.get("broker.id"))


def _meta_properties(path: Path) -> dict[str, str]:
    """meta.properties checked as Kafka's MetaProperties reads it: version 0 (a ZooKeeper-mode
    broker's: broker.id) or 1 (KRaft: node.id and cluster.id required), directory.id a Uuid.
    Returns the properties Kafka would write back (unknown keys dropped). ValueError says why not."""
    props = read_properties(path)
    version = props.get("version", "0")
    if version.strip() not in ("0", "1"):
        raise ValueError(f"Unknown meta.properties version number {version}" if version.strip().lstrip("-").isdigit()
                         else f"Invalid meta.properties version string '{version}'")
    version = version.strip()
    out = {"version": version}
    id_key = "broker.id" if version == "0" else "node.id"
    if id_key in props:
        if not props[id_key].lstrip("-").isdigit():
            raise ValueError(f"Unable to read {id_key} as a base-10 number.")
        out[id_key] = str(int(props[id_key]))
    elif version == "1":
        raise ValueError(f"Failed to find {id_key}")
    if "cluster.id" in props:
        out["cluster.id"] = props["cluster.id"]
    elif version == "1":
        raise ValueError("cluster.id was not found.")
    if "directory.id" in props:
        try:
            parse_kafka_uuid(props["directory.id"])
        except StorageError as e:
            raise ValueError(f"Unable to read directory.id as a Uuid: {e}") from None
        out["directory.id"] = props["directory.id"]
    return out
