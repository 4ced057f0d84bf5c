"""What the Kafka admin-tool commands (leader-election, log-dirs, delete-records, features,
transactions) share beyond strom.cli.common: Kafka's partition names, its JSON input files, and
connection options given before a subcommand, where Kafka's argparse-style tools take them."""

from __future__ import annotations

import json
from typing import Any

import click

from strom.cli.common import ClientSettings, CommandError, TopicPartition


def tp_name(tp: TopicPartition) -> str:
    """Kafka's TopicPartition.toString: `topic-partition`."""
    return f"{tp[0]}-{tp[1]}"


def read_json(path: str) -> Any:
    """A JSON input file; unreadable or invalid is a one-line CommandError."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise CommandError(f"cannot read {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CommandError(f"{path} is not valid JSON: {e}") from None
    except RecursionError:
        raise CommandError(f"{path}: JSON nested too deeply") from None


INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1
MAX_TOPIC_LENGTH = 249  # Kafka's limit on a topic name


def json_partition(item: dict, path: str) -> TopicPartition:
    """The `topic` and `partition` of one entry of a partition list, checked to be values the
    protocol can carry."""
    topic, partition = item.get("topic"), item.get("partition")
    if not isinstance(topic, str) or not 0 < len(topic) <= MAX_TOPIC_LENGTH:
        raise CommandError(f'{path}: "topic" must be a topic name, got {json.dumps(topic)[:300]}')
    if not is_int(partition) or not 0 <= partition <= INT32_MAX:
        raise CommandError(f'{path}: "partition" of {topic} must be a partition number, got {json.dumps(partition)}')
    return topic, partition


def topic_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A --topic value: a name no longer than Kafka allows (longer cannot be a topic's)."""
    if value is not None and not 0 < len(value) <= MAX_TOPIC_LENGTH:
        raise click.BadParameter(f"a topic name has 1 to {MAX_TOPIC_LENGTH} characters")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def group_client(client: ClientSettings) -> ClientSettings:
    """A subcommand's own --bootstrap-server/--command-config, else those given to its group
    (`strom transactions --bootstrap-server H:P list`, as kafka-transactions.sh is run)."""
    ctx = click.get_current_context()
    own = (ctx.get_parameter_source("bootstrap") != click.core.ParameterSource.DEFAULT
           or ctx.params.get("command_config"))
    return client if own or not isinstance(ctx.obj, ClientSettings) else ctx.obj
