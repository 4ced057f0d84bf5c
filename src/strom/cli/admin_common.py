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


def group_client(client: ClientSettings) -> ClientSettings:
    """A subcommand's own --bootstrap-server/--command-config, else those given to its group
    (`strom transactions --bootstrap-server H:P list`, as kafka-transactions.sh is run)."""
    ctx = click.get_current_context()
    own = (ctx.get_parameter_source("bootstrap") != click.core.ParameterSource.DEFAULT
           or ctx.params.get("command_config"))
    return client if own or not isinstance(ctx.obj, ClientSettings) else ctx.obj
