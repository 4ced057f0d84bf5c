"""`strom cluster cluster-id` and `strom cluster unregister`, in the manner of Kafka's
kafka-cluster.sh: the cluster id from DescribeCluster, and UnregisterBroker (KRaft: the
controller forgets a broker that is gone for good). Both go to brokers (--bootstrap-server) or,
as Kafka's tool allows, straight to the controllers (--bootstrap-controller).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from strom.cli.common import (
    BrokerConnection,
    ClientSettings,
    Command,
    CommandError,
    client_options,
    error_text,
    parse_servers,
)
from strom.protocol.errors import ErrorCode

DESCRIBE_CLUSTER, UNREGISTER_BROKER = 60, 64
BROKERS, CONTROLLERS = 1, 2  # DescribeCluster's endpoint types
UNSUPPORTED = "The target cluster does not support the broker unregistration API."


def _controller_option(f: Callable) -> Callable:
    return click.option("--bootstrap-controller", "controllers", metavar="HOST:PORT[,...]",
                        help="Controllers to ask (their controller listener) instead of brokers.")(f)


def _targets(client: ClientSettings, controllers: str | None) -> ClientSettings:
    if controllers is None:
        return client
    if click.get_current_context().get_parameter_source("bootstrap") != click.core.ParameterSource.DEFAULT:
        raise click.UsageError("give one of --bootstrap-server and --bootstrap-controller")
    return ClientSettings(parse_servers(controllers), client.properties)


def _each(settings: ClientSettings, request: Callable[[BrokerConnection], Any]) -> Any:
    """`request` at the first server that accepts a connection and answers (errors other than
    NOT_CONTROLLER end the search: the cluster refused)."""
    failure: CommandError | None = None
    answer = None
    for host, port in settings.servers:
        try:
            conn = BrokerConnection(host, port, settings)
        except CommandError as e:
            failure = e
            continue
        try:
            answer = request(conn)
        finally:
            conn.close()
        if answer.error_code != ErrorCode.NOT_CONTROLLER:
            return answer
    if answer is not None:
        return answer
    assert failure is not None
    raise failure


@click.command("cluster-id", cls=Command)
@client_options()
@_controller_option
def cluster_id(client: ClientSettings, controllers: str | None) -> None:
    """Print the cluster's id (like kafka-cluster cluster-id).

    \b
    Examples:
      strom cluster cluster-id --bootstrap-server 127.0.0.1:9092
      strom cluster cluster-id --bootstrap-controller 127.0.0.1:9093
    """
    # v1 names the listener asked: a controller answers only as one (endpoint type 2).
    endpoint_type = BROKERS if controllers is None else CONTROLLERS
    body = _each(_targets(client, controllers), lambda conn: conn.call(
        DESCRIBE_CLUSTER, 1, {"include_cluster_authorized_operations": False, "endpoint_type": endpoint_type}))
    if body.error_code != ErrorCode.NONE:
        raise CommandError(f"describing the cluster failed: {error_text(body.error_code, body.error_message)}")
    click.echo(f"Cluster ID: {body.cluster_id}")


def _unregister(conn: BrokerConnection, broker_id: int) -> Any:
    # Imported here: `strom cluster up` loads this module too, and needs none of it.
    from strom.cli.api_versions import api_versions

    # A ZooKeeper-mode broker does not serve the API (nor does Kafka's): ask before sending.
    if not any(a.api_key == UNREGISTER_BROKER for a in api_versions(conn).api_keys):
        raise CommandError(UNSUPPORTED)
    return conn.call(UNREGISTER_BROKER, 0, {"broker_id": broker_id})


@click.command("unregister", cls=Command)
@client_options()
@_controller_option
@click.option("--id", "broker_id", required=True, type=click.IntRange(0, 2**31 - 1), help="The broker to unregister.")
def unregister(client: ClientSettings, controllers: str | None, broker_id: int) -> None:
    """Remove a broker's registration from a KRaft cluster (like kafka-cluster unregister), so
    that a broker retired for good no longer counts as one of the cluster's.

    \b
    Examples:
      strom cluster unregister --bootstrap-controller 127.0.0.1:9093 --id 4
      strom cluster unregister --bootstrap-server 127.0.0.1:9092 --id 4
    """
    body = _each(_targets(client, controllers), lambda conn: _unregister(conn, broker_id))
    if body.error_code == ErrorCode.UNSUPPORTED_VERSION:
        raise CommandError(UNSUPPORTED)
    if body.error_code != ErrorCode.NONE:
        raise CommandError(f"unregistering broker {broker_id} failed: {error_text(body.error_code, body.error_message)}")
    click.echo(f"Broker {broker_id} is no longer registered.")
