"""`strom leader-election`: preferred or unclean leader election on demand, in the manner of
Kafka's kafka-leader-election.sh (the same options, the same three kinds of output line), sent
with ElectLeaders to the controller (asked again on NOT_CONTROLLER).
"""

from __future__ import annotations

import json
from typing import Any

import click

from strom.cli.admin_common import json_partition, read_json, topic_option, tp_name
from strom.cli.common import (
    ClientSettings,
    Cluster,
    Command,
    CommandError,
    TopicPartition,
    client_options,
    error_text,
)
from strom.protocol.errors import ErrorCode

ELECT_LEADERS = 43
ELECTION_TYPES = {"PREFERRED": 0, "UNCLEAN": 1}
TIMEOUT_MS = 30_000  # what Kafka's tool gives the election


def parse_election_file(data: Any, path: str) -> list[TopicPartition]:
    """`{"partitions": [{"topic": "t", "partition": 0}, ...]}`; a partition listed twice is an
    error, as in Kafka."""
    if not isinstance(data, dict) or "partitions" not in data:
        raise CommandError(f'{path}: Replica election data is missing "partitions" field')
    items = data["partitions"]
    if not isinstance(items, list):
        raise CommandError(f'{path}: "partitions" must be a list')
    out: list[TopicPartition] = []
    for item in items:
        if not isinstance(item, dict):
            raise CommandError(f'{path}: each partition must be {{"topic": "<name>", "partition": <n>}}, '
                               f"got {json.dumps(item)[:300]}")
        out.append(json_partition(item, path))
    duplicates = sorted({tp for tp in out if out.count(tp) > 1})
    if duplicates:
        raise CommandError(f"Replica election data contains duplicate partitions: "
                           f"{', '.join(map(tp_name, duplicates))}")
    if not out:
        raise CommandError(f"{path}: Replica election data is empty")
    return out


def request_partitions(partitions: list[TopicPartition] | None) -> list[dict] | None:
    """ElectLeaders' topic_partitions: None asks for every eligible partition."""
    if partitions is None:
        return None
    by_topic: dict[str, list[int]] = {}
    for topic, index in sorted(partitions):
        by_topic.setdefault(topic, []).append(index)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]


def report(election: str, results: dict[TopicPartition, tuple[int, str | None]]) -> list[str]:
    """Kafka's lines: the elected, those whose valid leader stood already, then one error line
    per failed partition (these make the command fail)."""
    done = sorted(tp for tp, (code, _) in results.items() if code == ErrorCode.NONE)
    noop = sorted(tp for tp, (code, _) in results.items() if code == ErrorCode.ELECTION_NOT_NEEDED)
    lines = []
    if done:
        lines.append(f"Successfully completed leader election ({election}) for partitions "
                     f"{', '.join(map(tp_name, done))}")
    if noop:
        lines.append(f"Valid replica already elected for partitions {', '.join(map(tp_name, noop))}")
    for tp, (code, message) in sorted(results.items()):
        if code not in (ErrorCode.NONE, ErrorCode.ELECTION_NOT_NEEDED):
            lines.append(f"Error completing leader election ({election}) for partition: "
                         f"{tp_name(tp)}: {error_text(code, message)}")
    return lines


@click.command("leader-election", cls=Command)
@client_options("--admin.config")
@click.option("--election-type", required=True, metavar="PREFERRED|UNCLEAN",
              type=click.Choice(list(ELECTION_TYPES), case_sensitive=False),
              help="preferred: move leadership back to the first replica where it is in the ISR; "
                   "unclean: elect a replica outside the ISR where a partition has no leader.")
@click.option("--topic", callback=topic_option, help="The topic of the one partition to elect (with --partition).")
@click.option("--partition", type=click.IntRange(0, 2**31 - 1), help="That partition's number.")
@click.option("--all-topic-partitions", is_flag=True, help="Every partition the election type applies to.")
@click.option("--path-to-json-file", metavar="FILE",
              help='Partitions as {"partitions": [{"topic": "foo", "partition": 1}, ...]}.')
def leader_election(client: ClientSettings, election_type: str, topic: str | None, partition: int | None,
                    all_topic_partitions: bool, path_to_json_file: str | None) -> None:
    """Elect partition leaders (like kafka-leader-election): one of --topic with --partition,
    --all-topic-partitions or --path-to-json-file.

    \b
    Examples:
      strom leader-election --election-type PREFERRED --all-topic-partitions
      strom leader-election --election-type preferred --topic orders --partition 3
      strom leader-election --election-type UNCLEAN --path-to-json-file partitions.json
    """
    given = sum((topic is not None, all_topic_partitions, path_to_json_file is not None))
    if given != 1:  # Kafka's wording for each of these mistakes
        raise click.UsageError("One and only one of the following options is required: --topic, "
                               "--all-topic-partitions, --path-to-json-file")
    if topic is not None and partition is None:
        raise click.UsageError("Missing required option(s): --partition")
    if topic is None and partition is not None:
        raise click.UsageError("Option --partition is only allowed if --topic is used")
    election = election_type.upper()
    partitions: list[TopicPartition] | None = None
    if path_to_json_file is not None:
        partitions = parse_election_file(read_json(path_to_json_file), path_to_json_file)
    elif topic is not None:
        assert partition is not None
        partitions = [(topic, partition)]
    with Cluster(client) as cluster:
        body = cluster.at_controller(ELECT_LEADERS, 1, {
            "election_type": ELECTION_TYPES[election], "timeout_ms": TIMEOUT_MS,
            "topic_partitions": request_partitions(partitions)}, lambda body: body)
    if body.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
        click.echo("Not authorized to perform leader election")
        raise CommandError("Not authorized to perform leader election")
    if body.error_code != ErrorCode.NONE:
        raise CommandError(f"leader election failed: {error_text(body.error_code)}")
    results = {(t.topic, p.partition_id): (p.error_code, p.error_message)
               for t in body.replica_election_results for p in t.partition_result}
    for line in report(election, results):
        click.echo(line)
    failed = sum(code not in (ErrorCode.NONE, ErrorCode.ELECTION_NOT_NEEDED) for code, _ in results.values())
    if failed:
        raise CommandError(f"{failed} replica(s) could not be elected")
