"""`strom acls add|list|remove`: Kafka's kafka-acls.sh over CreateAcls / DescribeAcls /
DeleteAcls, with its options (--allow-principal, --operation, --topic, --group, --producer,
--consumer, --resource-pattern-type, ...)."""

from __future__ import annotations

import click

from strom.cli.common import (
    ClientSettings,
    Cluster,
    CommandError,
    KafkaToolGroup,
    client_options,
    error_name,
)

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
RESOURCES = {"topic": 2, "group": 3, "cluster": 4, "transactional_id": 5, "delegation_token": 6, "user": 7}
RESOURCE_LABELS = {2: "TOPIC", 3: "GROUP", 4: "CLUSTER", 5: "TRANSACTIONAL_ID", 6: "DELEGATION_TOKEN", 7: "USER"}
PATTERNS = {"any": 1, "match": 2, "literal": 3, "prefixed": 4}
PATTERN_LABELS = {1: "ANY", 2: "MATCH", 3: "LITERAL", 4: "PREFIXED"}
OPERATIONS = {"all": 2, "read": 3, "write": 4, "create": 5, "delete": 6, "alter": 7, "describe": 8,
              "clusteraction": 9, "describeconfigs": 10, "alterconfigs": 11, "idempotentwrite": 12,
              "createtokens": 13, "describetokens": 14}
OPERATION_LABELS = {v: k.upper() for k, v in OPERATIONS.items()}
ALLOW, DENY, ANY = 3, 2, 1


class AclsGroup(KafkaToolGroup):
    """`strom acls add|list|remove`, or kafka-acls.sh's `--add`, `--list`, `--remove`."""

    action_flags = {"--add": "add", "--list": "list", "--remove": "remove"}


@click.group(cls=AclsGroup)
def acls() -> None:
    """Add, list and remove ACLs (like kafka-acls.sh); the brokers need authorizer.class.name."""


def resource_options(f):
    for option in reversed([
        click.option("--topic", "topics", multiple=True, help="A topic (or prefix; * for all topics)."),
        click.option("--group", "groups", multiple=True, help="A consumer group (or prefix; * for all)."),
        click.option("--transactional-id", "txn_ids", multiple=True, help="A transactional id (or prefix)."),
        click.option("--delegation-token", "tokens", multiple=True, help="A delegation token id."),
        click.option("--user-principal", "users", multiple=True, help="A user, for CreateTokens/DescribeTokens."),
        click.option("--cluster", is_flag=True, help="The cluster."),
        click.option("--resource-pattern-type", "pattern", default=None,
                     type=click.Choice(sorted(PATTERNS), case_sensitive=False),
                     help="literal (default for add), prefixed, match, any (default for list/remove)."),
    ]):
        f = option(f)
    return f


def _resources(topics, groups, txn_ids, tokens, users, cluster) -> list[tuple[int, str]]:
    out = [(RESOURCES["topic"], t) for t in topics] + [(RESOURCES["group"], g) for g in groups]
    out += [(RESOURCES["transactional_id"], t) for t in txn_ids] + [(RESOURCES["delegation_token"], t) for t in tokens]
    out += [(RESOURCES["user"], u) for u in users]
    if cluster:
        out.append((RESOURCES["cluster"], "kafka-cluster"))
    return out


@acls.command()
@client_options()
@resource_options
@click.option("--allow-principal", "allow", multiple=True, metavar="User:NAME")
@click.option("--deny-principal", "deny", multiple=True, metavar="User:NAME")
@click.option("--allow-host", "allow_hosts", multiple=True, help="Hosts the allow ACLs hold for (default *).")
@click.option("--deny-host", "deny_hosts", multiple=True, help="Hosts the deny ACLs hold for (default *).")
@click.option("--operation", "operations", multiple=True, type=click.Choice(sorted(OPERATIONS), case_sensitive=False))
@click.option("--producer", is_flag=True, help="What a producer needs: WRITE, DESCRIBE, CREATE on the topics "
              "(WRITE and DESCRIBE on --transactional-id; IDEMPOTENT_WRITE on the cluster with --idempotent).")
@click.option("--consumer", is_flag=True, help="What a consumer needs: READ, DESCRIBE on the topics, READ on the groups.")
@click.option("--idempotent", is_flag=True, help="With --producer: IDEMPOTENT_WRITE on the cluster too.")
def add(client: ClientSettings, topics, groups, txn_ids, tokens, users, cluster, pattern, allow, deny, allow_hosts,
        deny_hosts, operations, producer, consumer, idempotent) -> None:
    """Add ACLs.

    \b
    Examples:
      strom acls add --allow-principal User:alice --operation read --operation describe --topic orders
      strom acls add --allow-principal User:alice --producer --topic orders
      strom acls add --allow-principal User:bob --consumer --topic orders --group billing
      strom acls add --allow-principal User:etl --operation all --topic etl- --resource-pattern-type prefixed
      strom acls add --deny-principal User:mallory --operation all --topic '*'
    """
    pattern_id = PATTERNS[(pattern or "literal").lower()]
    if pattern_id not in (PATTERNS["literal"], PATTERNS["prefixed"]):
        raise click.UsageError("ACLs are added with a literal or prefixed --resource-pattern-type")
    _check_shortcuts(producer, consumer, idempotent, topics, groups, cluster, txn_ids)
    bindings = _bindings(_resources(topics, groups, txn_ids, tokens, users, cluster), operations, producer,
                         consumer, idempotent)
    principals = [(p, ALLOW, allow_hosts or ("*",)) for p in allow] + [(p, DENY, deny_hosts or ("*",)) for p in deny]
    if not bindings or not principals:
        raise click.UsageError("name a resource, an operation (or --producer/--consumer) and a principal")
    creations = [{"resource_type": rtype, "resource_name": name, "resource_pattern_type": pattern_id,
                  "principal": principal, "host": host, "operation": op, "permission_type": permission}
                 for principal, permission, hosts in principals for host in hosts for rtype, name, op in bindings
                 if not (rtype == RESOURCES["cluster"] and pattern_id != PATTERNS["literal"])]
    with Cluster(client) as c:
        body = c.call(CREATE_ACLS, 3, {"creations": creations})
    failed = [r for r in body.results if r.error_code]
    if failed:
        raise CommandError(f"adding ACLs failed: {failed[0].error_message or error_name(failed[0].error_code)}")
    click.echo(f"Added {len(creations)} ACL(s).")


def _check_shortcuts(producer: bool, consumer: bool, idempotent: bool, topics, groups, cluster: bool,
                     txn_ids) -> None:
    """kafka-acls' rules for --producer, --consumer and --idempotent, with its messages."""
    if producer and not topics:
        raise click.UsageError("With --producer you must specify a --topic")
    if idempotent and not producer:
        raise click.UsageError("The --idempotent option is only available if --producer is set")
    if consumer and (not topics or not groups or (not producer and (cluster or txn_ids))):
        raise click.UsageError("With --consumer you must specify a --topic and a --group and no --cluster or "
                               "--transactional-id option should be specified.")


def _bindings(resources: list[tuple[int, str]], operations, producer: bool, consumer: bool,
              idempotent: bool) -> list[tuple[int, str, int]]:
    """(resource type, name, operation) for each ACL to add; --producer / --consumer expand as
    kafka-acls expands them."""
    out = [(rtype, name, OPERATIONS[op.lower()]) for rtype, name in resources for op in operations]
    for rtype, name in resources:
        if producer and rtype == RESOURCES["topic"]:
            out += [(rtype, name, OPERATIONS[op]) for op in ("write", "describe", "create")]
        if producer and rtype == RESOURCES["transactional_id"]:
            out += [(rtype, name, OPERATIONS[op]) for op in ("write", "describe")]
        if consumer and rtype == RESOURCES["topic"]:
            out += [(rtype, name, OPERATIONS[op]) for op in ("read", "describe")]
        if consumer and rtype == RESOURCES["group"]:
            out.append((rtype, name, OPERATIONS["read"]))
    if producer and idempotent:
        out.append((RESOURCES["cluster"], "kafka-cluster", OPERATIONS["idempotentwrite"]))
    return list(dict.fromkeys(out))


def _filters(targets: list[tuple[int, str | None, int]], pattern: str | None,
             who: list[tuple[str | None, int, tuple[str | None, ...]]]) -> list[dict]:
    """ACL filters for DescribeAcls / DeleteAcls: each (resource type, name, operation) of
    `targets` (name None and ANY: every one) for each (principal, permission, hosts) of `who`."""
    pattern_id = PATTERNS[(pattern or "any").lower()]
    return [{"resource_type_filter": rtype, "resource_name_filter": name, "pattern_type_filter": pattern_id,
             "principal_filter": principal, "host_filter": host, "operation": op, "permission_type": permission}
            for rtype, name, op in targets for principal, permission, hosts in who
            for host in hosts]


def _anyone(principal: str | None) -> list[tuple[str | None, int, tuple[str | None, ...]]]:
    """`principal` (None: any), with either permission, from any host."""
    return [(principal, ANY, (None,))]


def _format(rtype: int, name: str, pattern: int, acl) -> str:
    permission = "ALLOW" if acl.permission_type == ALLOW else "DENY"
    return (f"(principal={acl.principal}, host={acl.host}, operation={OPERATION_LABELS.get(acl.operation, acl.operation)}, "
            f"permissionType={permission}) on {RESOURCE_LABELS.get(rtype, rtype)}:{PATTERN_LABELS.get(pattern, pattern)}:{name}")


@acls.command("list")
@client_options()
@resource_options
@click.option("--principal", default=None, help="Only this principal's ACLs.")
def list_(client: ClientSettings, topics, groups, txn_ids, tokens, users, cluster, pattern, principal) -> None:
    """List ACLs (every ACL, or those on the named resources).

    \b
    Examples:
      strom acls list
      strom acls list --topic orders
      strom acls list --topic orders --resource-pattern-type match
    """
    printed = 0
    with Cluster(client) as c:
        resources = _resources(topics, groups, txn_ids, tokens, users, cluster) or [(ANY, None)]
        for f in _filters([(rtype, name, ANY) for rtype, name in resources], pattern, _anyone(principal)):
            body = c.call(DESCRIBE_ACLS, 3, f)
            if body.error_code:
                raise CommandError(body.error_message or error_name(body.error_code))
            for r in body.resources:
                for acl in r.acls:
                    click.echo(_format(r.resource_type, r.resource_name, r.pattern_type, acl))
                    printed += 1
    if not printed:
        click.echo("No ACLs.")


@acls.command()
@client_options()
@resource_options
@click.option("--principal", default=None, help="Only this principal's ACLs (allow or deny).")
@click.option("--allow-principal", "allow", multiple=True, metavar="User:NAME", help="Only this principal's ALLOW ACLs.")
@click.option("--deny-principal", "deny", multiple=True, metavar="User:NAME", help="Only this principal's DENY ACLs.")
@click.option("--allow-host", "allow_hosts", multiple=True, help="With --allow-principal: only for these hosts.")
@click.option("--deny-host", "deny_hosts", multiple=True, help="With --deny-principal: only for these hosts.")
@click.option("--operation", "operations", multiple=True, type=click.Choice(sorted(OPERATIONS), case_sensitive=False),
              help="Only these operations (default: every one).")
@click.option("--producer", is_flag=True, help="Only what --producer adds.")
@click.option("--consumer", is_flag=True, help="Only what --consumer adds (needs --topic and --group).")
@click.option("--idempotent", is_flag=True, help="With --producer: IDEMPOTENT_WRITE on the cluster too.")
@click.option("--force", is_flag=True, help="Remove every ACL when no resource is named.")
def remove(client: ClientSettings, topics, groups, txn_ids, tokens, users, cluster, pattern, principal, allow, deny,
           allow_hosts, deny_hosts, operations, producer, consumer, idempotent, force: bool) -> None:
    """Remove ACLs of the named resources: all of them, or only those of a principal, a
    permission, hosts and operations, as kafka-acls --remove narrows them.

    \b
    Examples:
      strom acls remove --topic orders --principal User:alice
      strom acls remove --topic orders --allow-principal User:alice --operation read
      strom acls remove --topic orders --group billing --allow-principal User:bob --consumer
      strom acls remove --force
    """
    resources = _resources(topics, groups, txn_ids, tokens, users, cluster)
    if not resources and not force:
        raise click.UsageError("name the resources whose ACLs to remove, or --force to remove all")
    if principal and (allow or deny):
        raise click.UsageError("--principal matches either permission: not with --allow-principal/--deny-principal")
    _check_shortcuts(producer, consumer, idempotent, topics, groups, cluster, txn_ids)
    if operations or producer or consumer:
        targets = _bindings(resources, operations, producer, consumer, idempotent)
    else:
        targets = [(rtype, name, ANY) for rtype, name in resources or [(ANY, None)]]
    who = [(p, ALLOW, allow_hosts or (None,)) for p in allow] + [(p, DENY, deny_hosts or (None,)) for p in deny]
    with Cluster(client) as c:
        body = c.call(DELETE_ACLS, 3, {"filters": _filters(targets, pattern, who or _anyone(principal))})
    removed = 0
    for result in body.filter_results:
        if result.error_code:
            raise CommandError(f"removing ACLs failed: {result.error_message or error_name(result.error_code)}")
        removed += len(result.matching_acls)
    click.echo(f"Removed {removed} ACL(s).")
