"""`strom configs describe|alter`: Kafka's kafka-configs.sh for topics, brokers and broker
loggers.

Talks to a broker over the Kafka protocol (DescribeConfigs v4, IncrementalAlterConfigs v1),
so it works against any Kafka-compatible broker, not only Strom.
"""

from __future__ import annotations

import re

import click

from strom.cli.common import (
    ClientSettings,
    Cluster,
    CommandError,
    KafkaToolGroup,
    client_options,
    error_name,
    take_option,
)

DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 44
TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8
SET, DELETE = 0, 1
SOURCES = {0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
           3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG",
           6: "DYNAMIC_BROKER_LOGGER_CONFIG"}
DYNAMIC_SOURCES = {1, 2, 3, 6}


def _call(client: ClientSettings, api_key: int, version: int, fields: dict, rtype: int, name: str):
    """The request, to the broker a broker's (or its loggers') resource names, as Kafka's admin
    client sends it; anything else to the bootstrap server."""
    with Cluster(client) as cluster:
        if rtype in (BROKER, BROKER_LOGGER) and name:
            cluster.metadata([])
            if int(name) not in cluster.brokers:
                raise CommandError(f"broker {name} is not in the cluster (brokers: "
                                   f"{', '.join(map(str, sorted(cluster.brokers)))})")
            return cluster.broker(int(name)).call(api_key, version, fields)
        return cluster.call(api_key, version, fields)


def _resource(topic: str | None, broker: int | None, broker_defaults: bool,
              broker_logger: int | None) -> tuple[int, str, str]:
    """(resource type, resource name, description) from the entity options."""
    chosen = [x for x in (topic is not None, broker is not None, broker_defaults, broker_logger is not None) if x]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --topic, --broker, --broker-defaults, --broker-logger")
    if topic is not None:
        return TOPIC, topic, f"topic {topic}"
    if broker is not None:
        return BROKER, str(broker), f"broker {broker}"
    if broker_logger is not None:
        return BROKER_LOGGER, str(broker_logger), f"the loggers of broker {broker_logger}"
    return BROKER, "", "the default broker"


def parse_config_list(text: str) -> dict[str, str]:
    """`k=v,k2=[a,b]` as kafka-configs takes it: brackets group a list value's commas."""
    out: dict[str, str] = {}
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected key=value, got {item!r}")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        out[key.strip()] = value
    return out


entity_options = [
    client_options(),
    click.option("--topic", default=None, help="A topic's configs."),
    click.option("--broker", type=int, default=None, help="A broker's configs (by id)."),
    click.option("--broker-defaults", is_flag=True, help="The cluster-wide dynamic broker defaults."),
    click.option("--broker-logger", type=int, default=None, metavar="ID",
                 help="A broker's logger levels (kafka-configs --entity-type broker-loggers)."),
]


def _with_entity_options(f):
    for option in reversed(entity_options):
        f = option(f)
    return f


# kafka-configs.sh's --entity-type (singular or plural) as the option Strom's commands take.
ENTITY_OPTIONS = {"topics": "--topic", "topic": "--topic", "brokers": "--broker", "broker": "--broker",
                  "broker-loggers": "--broker-logger", "broker-logger": "--broker-logger"}


class ConfigsGroup(KafkaToolGroup):
    """`strom configs describe|alter`, or kafka-configs.sh's `--describe` / `--alter` with
    `--entity-type`, `--entity-name` and `--entity-default`."""

    action_flags = {"--describe": "describe", "--alter": "alter"}

    def kafka_line(self, command: str, args: list[str]) -> list[str]:
        args, types = take_option(args, "--entity-type")
        args, names = take_option(args, "--entity-name")
        default = "--entity-default" in args
        args = [a for a in args if a != "--entity-default"]
        if not types:
            return args
        kind = types[-1]
        if kind not in ENTITY_OPTIONS:
            raise click.UsageError(f"--entity-type {kind}: Strom's `configs` takes topics, brokers and "
                                   "broker-loggers (client quotas: `strom quotas`; SCRAM users: `strom users`)")
        if default:
            if ENTITY_OPTIONS[kind] != "--broker":
                raise click.UsageError(f"--entity-default is for brokers, not {kind}")
            return [*args, "--broker-defaults"]
        if len(names) != 1:
            raise click.UsageError("--entity-type needs one --entity-name (or --entity-default)")
        return [*args, ENTITY_OPTIONS[kind], names[0]]


@click.group(cls=ConfigsGroup)
def configs() -> None:
    """Describe or change topic and broker configs (like kafka-configs.sh)."""


@configs.command()
@_with_entity_options
@click.option("--all", "show_all", is_flag=True, help="Every config, not just the dynamic ones.")
def describe(client: ClientSettings, topic: str | None, broker: int | None, broker_defaults: bool,
             broker_logger: int | None, show_all: bool) -> None:
    """Print the configs of a topic or broker with their synonyms.

    \b
    Example:
      strom configs describe --topic orders
      strom configs describe --broker 1 --all
      strom configs describe --broker-defaults
      strom configs describe --broker-logger 1
    """
    rtype, name, what = _resource(topic, broker, broker_defaults, broker_logger)
    body = _call(client, DESCRIBE_CONFIGS, 4, {
        "resources": [{"resource_type": rtype, "resource_name": name, "configuration_keys": None}],
        "include_synonyms": True, "include_documentation": False,
    }, rtype, name)
    result = body.results[0]
    if result.error_code:
        raise CommandError(result.error_message or error_name(result.error_code))
    entries = [c for c in result.configs if show_all or c.config_source in DYNAMIC_SOURCES]
    click.echo(f"{'All' if show_all else 'Dynamic'} configs for {what} are:")
    for c in entries:
        synonyms = ", ".join(f"{SOURCES.get(s.source, s.source)}:{s.name}={s.value}" for s in c.synonyms)
        value = "null" if c.value is None else c.value
        click.echo(f"  {c.name}={value} sensitive={str(c.is_sensitive).lower()} synonyms={{{synonyms}}}")


@configs.command()
@_with_entity_options
@click.option("--add-config", "add", default="", metavar="K=V,...",
              help="Configs to set, e.g. retention.ms=1000,cleanup.policy=[compact,delete].")
@click.option("--delete-config", "delete", default="", metavar="K,...", help="Configs to remove.")
def alter(client: ClientSettings, topic: str | None, broker: int | None, broker_defaults: bool,
          broker_logger: int | None, add: str, delete: str) -> None:
    """Set or remove dynamic configs of a topic or broker, or a broker's logger levels.

    \b
    Example:
      strom configs alter --topic orders --add-config retention.ms=86400000,cleanup.policy=[compact,delete]
      strom configs alter --topic orders --delete-config retention.ms
      strom configs alter --broker-defaults --add-config log.retention.ms=604800000
      strom configs alter --broker-logger 0 --add-config strom.request=DEBUG
    """
    rtype, name, what = _resource(topic, broker, broker_defaults, broker_logger)
    to_set = parse_config_list(add)
    to_delete = [k.strip() for k in delete.split(",") if k.strip()]
    if not to_set and not to_delete:
        raise click.UsageError("nothing to do: give --add-config and/or --delete-config")
    entries = [{"name": k, "config_operation": SET, "value": v} for k, v in to_set.items()]
    entries += [{"name": k, "config_operation": DELETE, "value": None} for k in to_delete]
    body = _call(client, INCREMENTAL_ALTER_CONFIGS, 1, {
        "resources": [{"resource_type": rtype, "resource_name": name, "configs": entries}],
        "validate_only": False,
    }, rtype, name)
    response = body.responses[0]
    if response.error_code:
        raise CommandError(f"altering the configs of {what} failed: "
                           f"{response.error_message or error_name(response.error_code)}")
    click.echo(f"Completed updating config for {what}.")
