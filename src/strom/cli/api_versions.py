"""`strom broker-api-versions` and `strom features`, in the manner of Kafka's
kafka-broker-api-versions.sh and kafka-features.sh: both read ApiVersions (v3: the APIs and
version ranges a broker serves, the features it supports and the levels the cluster has
finalized); upgrade and downgrade send UpdateFeatures to the controller.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

import click

from strom.cli.admin_common import group_client
from strom.cli.common import (
    ClientSettings,
    Cluster,
    Command,
    CommandError,
    Group,
    client_options,
    error_text,
)
from strom.controller.features import SUPPORTED
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import CODEC_MODULES, registered_codecs

API_VERSIONS, UPDATE_FEATURES = 18, 57
METADATA_VERSION = "metadata.version"
# Kafka's MetadataVersion releases by feature level (1 is 3.0-IV1; 25 is 4.0-IV3).
METADATA_RELEASES = ["3.0-IV1", "3.1-IV0", "3.2-IV0", "3.3-IV0", "3.3-IV1", "3.3-IV2", "3.3-IV3",
                     "3.4-IV0", "3.5-IV0", "3.5-IV1", "3.5-IV2", "3.6-IV0", "3.6-IV1", "3.6-IV2",
                     "3.7-IV0", "3.7-IV1", "3.7-IV2", "3.7-IV3", "3.7-IV4", "3.8-IV0", "3.9-IV0",
                     "4.0-IV0", "4.0-IV1", "4.0-IV2", "4.0-IV3"]
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


def api_versions(conn: Any) -> Any:
    try:
        version = importlib.metadata.version("strom")
    except importlib.metadata.PackageNotFoundError:
        version = "0"
    body = conn.call(API_VERSIONS, 3, {"client_software_name": "strom-cli", "client_software_version": version})
    if body.error_code != ErrorCode.NONE:
        raise CommandError(f"{conn.address}: {error_text(body.error_code)}")
    return body


def client_apis() -> tuple[dict[int, tuple[str, int, int]], set[int]]:
    """The APIs this client knows, by key (Kafka's name and the versions it speaks), and among
    them the client-facing ones (Kafka's own codecs), which a broker lacking one is expected to
    have: the others run between brokers and controllers."""
    for module in CODEC_MODULES:
        importlib.import_module(module)
    requests, _ = registered_codecs()
    known = {key: (cls.__name__.removesuffix("Request"), cls.min_version, cls.max_version)
             for key, cls in requests.items()}
    client_facing = {key for module, keys in CODEC_MODULES.items() if module.startswith("kafka.") for key in keys}
    return known, client_facing & set(known)


def api_line(key: int, low: int, high: int, known: dict[int, tuple[str, int, int]]) -> str:
    """Kafka's NodeApiVersions text of one API: its range and the version this client would use."""
    span = str(low) if low == high else f"{low} to {high}"
    if key not in known:
        return f"UNKNOWN({key}): {span}"
    name, client_low, client_high = known[key]
    if client_high < low:
        usable = "[unusable: node too new]"
    elif high < client_low:
        usable = "[unusable: node too old]"
    else:
        usable = f"[usable: {min(high, client_high)}]"
    return f"{name}({key}): {span} {usable}"


def describe_apis(body: Any, known: dict[int, tuple[str, int, int]], expected: set[int]) -> str:
    lines = {a.api_key: api_line(a.api_key, a.min_version, a.max_version, known) for a in body.api_keys}
    for key in expected:
        lines.setdefault(key, f"{known[key][0]}({key}): UNSUPPORTED")
    return "(\n\t" + ",\n\t".join(lines[k] for k in sorted(lines)) + "\n)"


@click.command("broker-api-versions", cls=Command)
@client_options()
def broker_api_versions(client: ClientSettings) -> None:
    """The API versions each broker serves, as kafka-broker-api-versions prints them: per
    broker `host:port (id: N rack: R) -> (` then one `Name(key): min to max [usable: v]` line
    per API.

    \b
    Example:
      strom broker-api-versions --bootstrap-server 127.0.0.1:9092
    """
    known, expected = client_apis()
    with Cluster(client) as cluster:
        meta = cluster.metadata([])
        for b in sorted(meta.brokers, key=lambda b: b.node_id):
            node = f"{b.host}:{b.port} (id: {b.node_id} rack: {b.rack or 'null'})"
            try:
                text = describe_apis(api_versions(cluster.broker(b.node_id)), known, expected)
            except CommandError as e:
                text = f"ERROR: {e.message}"
            click.echo(f"{node} -> {text}")


def level_text(feature: str, level: int) -> str:
    """metadata.version levels by release name, as Kafka prints them; others as numbers."""
    if feature != METADATA_VERSION:
        return str(level)
    return METADATA_RELEASES[level - 1] if 1 <= level <= len(METADATA_RELEASES) else f"UNKNOWN {level}"


def metadata_level(release: str) -> int:
    try:
        return METADATA_RELEASES.index(release) + 1
    except ValueError:
        raise click.BadParameter(f"unknown metadata.version {release!r} (known: {', '.join(METADATA_RELEASES)})",
                                 param_hint="'--metadata'") from None


@click.group(cls=Group)
@client_options()
@click.pass_context
def features(ctx: click.Context, client: ClientSettings) -> None:
    """The cluster's feature levels (like kafka-features): describe, upgrade, downgrade,
    version-mapping, feature-dependencies.
    --bootstrap-server and --command-config may come before the subcommand, as Kafka's tool
    takes them, or after it."""
    ctx.obj = client


@features.command(cls=Command)
@client_options()
def describe(client: ClientSettings) -> None:
    """One line per feature the broker supports: its supported range, the cluster's finalized
    level (0: not finalized) and the finalized-features epoch.

    \b
    Example:
      strom features describe
    """
    with Cluster(group_client(client)) as cluster:
        body = api_versions(cluster.bootstrap)
    finalized = {f.name: f.max_version_level for f in body.finalized_features}
    epoch = body.finalized_features_epoch if body.finalized_features_epoch >= 0 else "-"
    for f in sorted(body.supported_features, key=lambda f: f.name):
        click.echo(f"Feature: {f.name}\tSupportedMinVersion: {level_text(f.name, f.min_version)}\t"
                   f"SupportedMaxVersion: {level_text(f.name, f.max_version)}\t"
                   f"FinalizedVersionLevel: {level_text(f.name, finalized.get(f.name, 0))}\tEpoch: {epoch}")


def _updates(feature: tuple[str, ...], metadata: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in feature:
        name, sep, level = item.partition("=")
        if not sep or not name.strip() or not level.strip().isdigit():
            raise click.BadParameter(f"expected NAME=LEVEL, got {item!r}", param_hint="'--feature'")
        out[name.strip()] = int(level)
    if metadata is not None:
        out[METADATA_VERSION] = metadata_level(metadata)
    if not out:
        raise click.UsageError("give --feature NAME=LEVEL (repeatable) or --metadata RELEASE")
    return out


def _update(client: ClientSettings, verb: str, updates: dict[str, int], upgrade_type: int, dry_run: bool) -> None:
    with Cluster(group_client(client)) as cluster:
        body = cluster.at_controller(UPDATE_FEATURES, 1, {
            "timeout_ms": 60_000, "validate_only": dry_run,
            "feature_updates": [{"feature": name, "max_version_level": level, "upgrade_type": upgrade_type}
                                for name, level in sorted(updates.items())]}, lambda body: body)
    results = {r.feature: (r.error_code, r.error_message) for r in body.results}
    failed = 0
    for name, level in sorted(updates.items()):
        code, message = results.get(name, (body.error_code, body.error_message))
        if body.error_code != ErrorCode.NONE:
            code, message = body.error_code, body.error_message
        shown = level_text(name, level)
        if code == ErrorCode.NONE:
            click.echo(f"{name} can be {verb}d to {shown}." if dry_run else f"{name} was {verb}d to {shown}.")
        else:
            failed += 1
            click.echo(f"Could not {verb} {name} to {shown}. {error_text(code, message)}")
    if failed:
        raise CommandError(f"{failed} out of {len(updates)} operation(s) failed.")


@features.command(cls=Command)
@client_options()
@click.option("--feature", multiple=True, metavar="NAME=LEVEL", help="A feature and its new level (repeatable).")
@click.option("--metadata", metavar="RELEASE", help="metadata.version's new level by release, e.g. 4.0-IV3.")
@click.option("--dry-run", is_flag=True, help="Check the change without making it.")
def upgrade(client: ClientSettings, feature: tuple[str, ...], metadata: str | None, dry_run: bool) -> None:
    """Raise finalized feature levels.

    \b
    Examples:
      strom features upgrade --feature transaction.version=2
      strom features upgrade --metadata 4.0-IV3 --dry-run
    """
    _update(client, "upgrade", _updates(feature, metadata), UPGRADE, dry_run)


@features.command(cls=Command)
@client_options()
@click.option("--feature", multiple=True, metavar="NAME=LEVEL", help="A feature and its new level (repeatable).")
@click.option("--metadata", metavar="RELEASE", help="metadata.version's new level by release.")
@click.option("--unsafe", is_flag=True, help="Allow a downgrade that may lose metadata.")
@click.option("--dry-run", is_flag=True, help="Check the change without making it.")
def downgrade(client: ClientSettings, feature: tuple[str, ...], metadata: str | None, unsafe: bool,
              dry_run: bool) -> None:
    """Lower finalized feature levels (0 removes a feature's finalized level).

    \b
    Example:
      strom features downgrade --feature group.version=0
    """
    _update(client, "downgrade", _updates(feature, metadata), UNSAFE_DOWNGRADE if unsafe else SAFE_DOWNGRADE,
            dry_run)


# The metadata.version from which a new cluster gets each level of the other features (Kafka's
# FeatureVersion bootstrap versions: transaction.version 2 and group.version 1 from 4.0). Strom
# finalizes share.version 1 at its newest level, where Kafka waits for 4.1-IV1, which Strom's
# levels do not reach.
BOOTSTRAP_SINCE: dict[str, dict[int, str]] = {
    "transaction.version": {2: "4.0-IV2"},
    "group.version": {1: "4.0-IV0"},
    "share.version": {1: "4.0-IV3"},
    "eligible.leader.replicas.version": {1: "4.0-IV3"},
}


def release_level(release: str) -> int:
    """A release as kafka-features names it (4.0-IV3, or 4.0 for its newest level), as a
    metadata.version level a cluster can be formatted with."""
    lowest = SUPPORTED[METADATA_VERSION].min_level
    named = [i + 1 for i, r in enumerate(METADATA_RELEASES) if r == release or r.startswith(f"{release}-IV")]
    if not named or max(named) < lowest:
        raise CommandError(f"Unknown release version '{release}'. Supported versions are: "
                           f"{METADATA_RELEASES[lowest - 1]} to {METADATA_RELEASES[-1]}")
    return max(named)


def default_levels_at(level: int) -> dict[str, int]:
    """What a cluster formatted at metadata.version `level` finalizes for each other feature,
    in Kafka's order of its features."""
    names = [*BOOTSTRAP_SINCE, *(n for n in sorted(SUPPORTED) if n not in BOOTSTRAP_SINCE and n != METADATA_VERSION)]
    return {name: max((lvl for lvl, since in BOOTSTRAP_SINCE.get(name, {}).items()
                       if level >= metadata_level(since)), default=0) for name in names}


@features.command("version-mapping", cls=Command)
@click.option("--release-version", metavar="RELEASE",
              help=f"A release, e.g. 3.9 or 4.0-IV3 (default: {METADATA_RELEASES[-1]}).")
def version_mapping(release_version: str | None) -> None:
    """The feature levels a cluster formatted at a release gets, as kafka-features
    version-mapping prints them (no broker is asked).

    \b
    Example:
      strom features version-mapping --release-version 3.9
    """
    release = release_version or METADATA_RELEASES[-1]
    level = release_level(release)
    click.echo(f"{METADATA_VERSION}={level} ({release})")
    for name, feature_level in default_levels_at(level).items():
        click.echo(f"{name}={feature_level}")


@features.command("feature-dependencies", cls=Command)
@click.option("--feature", "feature", multiple=True, required=True, metavar="NAME=LEVEL",
              help="A feature level to look up, e.g. transaction.version=2 (repeatable).")
def feature_dependencies(feature: tuple[str, ...]) -> None:
    """The feature levels each given one requires, as kafka-features feature-dependencies
    prints them (no broker is asked). No level Strom supports requires another.

    \b
    Example:
      strom features feature-dependencies --feature transaction.version=2 --feature metadata.version=25
    """
    for name, level in _updates(feature, None).items():
        if name == METADATA_VERSION:
            if not 1 <= level <= len(METADATA_RELEASES):
                raise CommandError(f"Unknown metadata.version {level}")
            click.echo(f"{name}={level} ({level_text(name, level)}) has no dependencies.")
            continue
        supported = SUPPORTED.get(name)
        if supported is None:
            raise CommandError(f"Unknown feature: {name}")
        if not (level == 0 or supported.min_level <= level <= supported.max_level):
            raise CommandError(f"No level {level} of {name}: levels are {supported.min_level} to {supported.max_level}")
        click.echo(f"{name}={level} has no dependencies.")
