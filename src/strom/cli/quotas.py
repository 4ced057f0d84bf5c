"""`strom quotas set|remove|describe`: client quotas, as `kafka-configs.sh --entity-type
users|clients|ips` manages them, over AlterClientQuotas / DescribeClientQuotas (KIP-546)."""

from __future__ import annotations

import click

from strom.cli.common import (
    ClientSettings,
    Cluster,
    CommandError,
    Group,
    client_options,
    error_name,
)
from strom.cli.configs import parse_config_list
from strom.java_text import java_double

DESCRIBE, ALTER = 48, 49
EXACT, DEFAULT, ANY = 0, 1, 2


@click.group(cls=Group)
def quotas() -> None:
    """Client quotas: byte rates and request share per user / client id, connection rates per IP."""


def entity_options(f):
    for option in reversed([
        click.option("--user", help="A user (its principal's name)."),
        click.option("--user-default", is_flag=True, help="The default of every user."),
        click.option("--client-id", help="A client id."),
        click.option("--client-default", is_flag=True, help="The default of every client id."),
        click.option("--ip", help="An IP address (connection_creation_rate)."),
        click.option("--ip-default", is_flag=True, help="The default of every IP address."),
    ]):
        f = option(f)
    return f


def _entity(user, user_default, client_id, client_default, ip, ip_default) -> list[dict]:
    out = []
    for kind, name, default in (("user", user, user_default), ("client-id", client_id, client_default),
                                ("ip", ip, ip_default)):
        if name is not None and default:
            raise click.UsageError(f"give either --{kind} or --{kind.split('-')[0]}-default")
        if name is not None or default:
            out.append({"entity_type": kind, "entity_name": name})
    if not out:
        raise click.UsageError("name an entity: --user/--user-default, --client-id/--client-default, --ip/--ip-default")
    return out


def _describe_entity(entity: list[dict]) -> str:
    return ", ".join(f"{e['entity_type']}={e['entity_name'] if e['entity_name'] is not None else '<default>'}"
                     for e in entity)


def _alter(client: ClientSettings, entity: list[dict], ops: list[dict]) -> None:
    with Cluster(client) as cluster:
        body = cluster.call(ALTER, 1, {"entries": [{"entity": entity, "ops": ops}], "validate_only": False})
    result = body.entries[0]
    if result.error_code:
        raise CommandError(f"altering the quotas of {_describe_entity(entity)} failed: "
                           f"{result.error_message or error_name(result.error_code)}")


@quotas.command("set")
@client_options()
@entity_options
@click.argument("quota", nargs=-1, required=True, metavar="KEY=VALUE...")
def set_(client: ClientSettings, user, user_default, client_id, client_default, ip, ip_default,
         quota: tuple[str, ...]) -> None:
    """Set quotas of an entity: producer_byte_rate, consumer_byte_rate, request_percentage
    (users, client ids) or connection_creation_rate (IPs).

    \b
    Examples:
      strom quotas set --user alice producer_byte_rate=1048576 consumer_byte_rate=2097152
      strom quotas set --user-default request_percentage=50
      strom quotas set --client-id batch-loader --user alice producer_byte_rate=102400
      strom quotas set --ip-default connection_creation_rate=20
    """
    entity = _entity(user, user_default, client_id, client_default, ip, ip_default)
    values = parse_config_list(",".join(quota))
    try:
        ops = [{"key": k, "value": float(v), "remove": False} for k, v in values.items()]
    except ValueError as e:
        raise click.BadParameter(f"quota values are numbers: {e}") from None
    _alter(client, entity, ops)
    click.echo(f"Set quotas of {_describe_entity(entity)}.")


@quotas.command()
@client_options()
@entity_options
@click.argument("keys", nargs=-1, required=True, metavar="KEY...")
def remove(client: ClientSettings, user, user_default, client_id, client_default, ip, ip_default,
           keys: tuple[str, ...]) -> None:
    """Remove quotas of an entity.

    \b
    Example:
      strom quotas remove --user alice producer_byte_rate
    """
    entity = _entity(user, user_default, client_id, client_default, ip, ip_default)
    _alter(client, entity, [{"key": k, "value": 0.0, "remove": True} for k in keys])
    click.echo(f"Removed {', '.join(keys)} from {_describe_entity(entity)}.")


@quotas.command()
@client_options()
@click.option("--user", help="Only this user's quotas (and those of its clients).")
@click.option("--client-id", help="Only this client id's quotas.")
@click.option("--ip", help="Only this IP's quotas.")
def describe(client: ClientSettings, user: str | None, client_id: str | None, ip: str | None) -> None:
    """Print every quota set, or those of the entities named.

    \b
    Examples:
      strom quotas describe
      strom quotas describe --user alice
    """
    components = [{"entity_type": kind, "match_type": EXACT, "match": name}
                  for kind, name in (("user", user), ("client-id", client_id), ("ip", ip)) if name is not None]
    with Cluster(client) as cluster:
        body = cluster.call(DESCRIBE, 1, {"components": components, "strict": False})
    if body.error_code:
        raise CommandError(body.error_message or error_name(body.error_code))
    for entry in body.entries:
        entity = [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity]
        values = ", ".join(f"{v.key}={java_double(v.value)}" for v in entry.values)  # as kafka-configs prints them
        click.echo(f"Quota configs for {_describe_entity(entity)} are {values}")
