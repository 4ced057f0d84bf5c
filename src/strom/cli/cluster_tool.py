"""`strom cluster cluster-id` and `strom cluster unregister`, in the manner of Kafka's
kafka-cluster.sh: the cluster id from DescribeCluster, and UnregisterBroker (KRaft: the
controller forgets a broker that is gone for good).
"""

from __future__ import annotations

import click

from strom.cli.api_versions import api_versions
from strom.cli.common import (
    ClientSettings,
    Cluster,
    Command,
    CommandError,
    client_options,
    error_text,
)
from strom.protocol.errors import ErrorCode

DESCRIBE_CLUSTER, UNREGISTER_BROKER = 60, 64


@click.command("cluster-id", cls=Command)
@client_options()
def cluster_id(client: ClientSettings) -> None:
    """Print the cluster's id (like kafka-cluster cluster-id).

    \b
    Example:
      strom cluster cluster-id --bootstrap-server 127.0.0.1:9092
    """
    with Cluster(client) as cluster:
        body = cluster.call(DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False})
    if body.error_code != ErrorCode.NONE:
        raise CommandError(f"describing the cluster failed: {error_text(body.error_code, body.error_message)}")
    click.echo(f"Cluster ID: {body.cluster_id}")


@click.command("unregister", cls=Command)
@client_options()
@click.option("--id", "broker_id", required=True, type=click.IntRange(min=0), help="The broker to unregister.")
def unregister(client: ClientSettings, broker_id: int) -> None:
    """Remove a broker's registration from a KRaft cluster (like kafka-cluster unregister), so
    that a broker retired for good no longer counts as one of the cluster's.

    \b
    Example:
      strom cluster unregister --id 4
    """
    with Cluster(client) as cluster:
        # A ZooKeeper-mode broker does not serve the API (nor does Kafka's): ask before sending.
        if not any(a.api_key == UNREGISTER_BROKER for a in api_versions(cluster.bootstrap).api_keys):
            raise CommandError("The target cluster does not support the broker unregistration API.")
        body = cluster.call(UNREGISTER_BROKER, 0, {"broker_id": broker_id})
    if body.error_code == ErrorCode.UNSUPPORTED_VERSION:
        raise CommandError("The target cluster does not support the broker unregistration API.")
    if body.error_code != ErrorCode.NONE:
        raise CommandError(f"unregistering broker {broker_id} failed: {error_text(body.error_code, body.error_message)}")
    click.echo(f"Broker {broker_id} is no longer registered.")
