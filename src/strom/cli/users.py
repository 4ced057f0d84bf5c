"""`strom users scram-set|scram-delete|list`: SCRAM credentials, as `kafka-configs.sh
--entity-type users --alter --add-config 'SCRAM-SHA-256=[password=...]'` manages them.

Speaks AlterUserScramCredentials / DescribeUserScramCredentials (KIP-554) to any
Kafka-compatible broker. The password is salted and hashed here; only the salted password
travels, as with Kafka's own tools.
"""

from __future__ import annotations

import os

import click

from strom.cli.common import (
    ClientSettings,
    Cluster,
    CommandError,
    Group,
    client_options,
    error_name,
)
from strom.protocol.scram import (
    MAX_ITERATIONS,
    MECHANISM_BY_ID,
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    salted_password,
)

DESCRIBE, ALTER = 50, 51
MECHANISMS = click.Choice(sorted(SCRAM_MECHANISMS), case_sensitive=False)


@click.group(cls=Group)
def users() -> None:
    """Manage the SCRAM credentials of users (like kafka-configs.sh --entity-type users)."""


def _alter(client: ClientSettings, fields: dict, what: str) -> None:
    with Cluster(client) as cluster:
        body = cluster.call(ALTER, 0, fields)
    failed = [r for r in body.results if r.error_code]
    if failed:
        r = failed[0]
        raise CommandError(f"{what} for {r.user} failed: {r.error_message or error_name(r.error_code)}")


@users.command("scram-set")
@client_options()
@click.argument("user")
@click.option("--mechanism", type=MECHANISMS, default="SCRAM-SHA-256", show_default=True)
@click.option("--password", prompt=True, hide_input=True, help="Asked for when not given.")
@click.option("--iterations", type=click.IntRange(MIN_ITERATIONS, MAX_ITERATIONS), default=4096, show_default=True)
def scram_set(client: ClientSettings, user: str, mechanism: str, password: str, iterations: int) -> None:
    """Create or replace USER's credential for one SCRAM mechanism.

    \b
    Example:
      strom users scram-set alice --mechanism SCRAM-SHA-512 --password alice-secret
    """
    mechanism = mechanism.upper()
    salt = os.urandom(32)
    _alter(client, {"deletions": [], "upsertions": [{
        "name": user, "mechanism": SCRAM_MECHANISMS[mechanism][1], "iterations": iterations, "salt": salt,
        "salted_password": salted_password(mechanism, password, salt, iterations)}]}, f"setting {mechanism}")
    click.echo(f"Set {mechanism} credential for user {user}.")


@users.command("scram-delete")
@client_options()
@click.argument("user")
@click.option("--mechanism", type=MECHANISMS, required=True)
def scram_delete(client: ClientSettings, user: str, mechanism: str) -> None:
    """Remove USER's credential for one SCRAM mechanism.

    \b
    Example:
      strom users scram-delete alice --mechanism SCRAM-SHA-512
    """
    mechanism = mechanism.upper()
    _alter(client, {"deletions": [{"name": user, "mechanism": SCRAM_MECHANISMS[mechanism][1]}],
                    "upsertions": []}, f"deleting {mechanism}")
    click.echo(f"Deleted {mechanism} credential of user {user}.")


@users.command("list")
@client_options()
@click.argument("names", nargs=-1, metavar="[USER]...")
def list_(client: ClientSettings, names: tuple[str, ...]) -> None:
    """The users with SCRAM credentials (or just USERs), with mechanisms and iterations.

    \b
    Example:
      strom users list
      strom users list alice bob
    """
    with Cluster(client) as cluster:
        body = cluster.call(DESCRIBE, 0, {"users": [{"name": n} for n in names] if names else None})
    if body.error_code:
        raise CommandError(body.error_message or error_name(body.error_code))
    missing = [r for r in body.results if r.error_code]
    for r in body.results:
        if not r.error_code:
            creds = ", ".join(f"{MECHANISM_BY_ID.get(c.mechanism, c.mechanism)} (iterations={c.iterations})"
                              for c in r.credential_infos)
            click.echo(f"{r.user}: {creds}")
    if missing:
        raise CommandError(f"{missing[0].user}: {missing[0].error_message or error_name(missing[0].error_code)}")
