"""DescribeClientQuotas and AlterClientQuotas (KIP-546).

Quotas are configs of /config/users/<user>[/clients/<client>], /config/clients/<client> and
/config/ips/<ip> ("<default>" for an entity's default), next to users' SCRAM credentials,
announced through /config/changes as Kafka's ZooKeeper mode does; network/quotas.py enforces
them.
"""

from __future__ import annotations

from urllib.parse import unquote

from strom.config.repository import DEFAULT
from strom.network.quotas import IP_KEYS, check_entity, quota_keys
from strom.protocol.errors import ErrorCode
from strom.security.authorizer import ALTER_CONFIGS, CLUSTER, DESCRIBE_CONFIGS, allowed
from strom.server.apis import RequestContext, api

DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
EXACT, DEFAULT_MATCH, ANY = 0, 1, 2


def _entity_of(path: str) -> dict[str, str | None]:
    """/config path -> {"user": name or None for the default, "client-id": ...}."""
    out: dict[str, str | None] = {}
    parts = path.split("/")
    for kind, name in zip(parts[::2], parts[1::2], strict=True):
        key = {"users": "user", "clients": "client-id", "ips": "ip"}[kind]
        out[key] = None if name == DEFAULT else unquote(name)
    return out


def _matches(entity: dict[str, str | None], components, strict: bool) -> bool:
    for c in components:
        if c.entity_type not in entity:
            return False
        name = entity[c.entity_type]
        if (c.match_type == EXACT and name != c.match) or (c.match_type == DEFAULT_MATCH and name is not None):
            return False
    return not strict or set(entity) == {c.entity_type for c in components}


@api(DESCRIBE_CLIENT_QUOTAS, 0, 1)
async def handle_describe_client_quotas(broker, ctx: RequestContext, request) -> dict:
    if not allowed(broker, ctx, DESCRIBE_CONFIGS, CLUSTER):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "entries": [],
                "error_message": "Cluster authorization failed."}
    known = {"user", "client-id", "ip"}
    bad = [c.entity_type for c in request.components if c.entity_type not in known]
    if bad or len({c.entity_type for c in request.components}) != len(request.components):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_REQUEST, "entries": [],
                "error_message": f"Invalid or repeated entity types in the filter: {bad or 'repeated'}"}
    entries = []
    for path, configs in sorted(broker.config_repository.clients.items()):
        values = [{"key": k, "value": float(v)} for k, v in sorted(configs.items()) if k in quota_keys(path)]
        if not values:
            continue
        entity = _entity_of(path)
        if _matches(entity, request.components, request.strict):
            entries.append({"entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
                            "values": values})
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None, "entries": entries}


@api(ALTER_CLIENT_QUOTAS, 0, 1)
async def handle_alter_client_quotas(broker, ctx: RequestContext, request) -> dict:
    results = []
    for entry in request.entries:
        entity_data = [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity]
        if not allowed(broker, ctx, ALTER_CONFIGS, CLUSTER):
            results.append({"error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                            "error_message": "Cluster authorization failed.", "entity": entity_data})
            continue
        try:
            path, updates = validate_entry(entry)
        except ValueError as e:
            results.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(e), "entity": entity_data})
            continue
        if not request.validate_only:
            configs = dict(broker.config_repository.clients.get(path, {}))
            for key, value in updates.items():
                if value is None:
                    configs.pop(key, None)
                else:
                    configs[key] = value
            await broker.store_io(broker.admin.change_client_config, path, configs)
            broker.config_repository.clients[path] = configs
        results.append({"error_code": ErrorCode.NONE, "error_message": None, "entity": entity_data})
    return {"throttle_time_ms": 0, "entries": results}


def validate_entry(entry) -> tuple[str, dict[str, str | None]]:
    """The entity's /config path and {key: new value, or None to remove}; ValueError as Kafka
    words its INVALID_REQUEST answers."""
    entity: dict[str, str | None] = {}
    for e in entry.entity:
        if e.entity_type in entity:
            raise ValueError(f"Duplicate {e.entity_type} entity")
        if e.entity_type not in ("user", "client-id", "ip"):
            raise ValueError(f"Unhandled client quota entity type: {e.entity_type}")
        entity[e.entity_type] = e.entity_name
    path = check_entity(entity)
    allowed = quota_keys(path)
    updates: dict[str, str | None] = {}
    for op in entry.ops:
        kind = allowed.get(op.key)
        if kind is None:
            raise ValueError(f"Invalid configuration key {op.key}; {'an IP' if allowed is IP_KEYS else 'a user or client id'} "
                             f"quota is one of {', '.join(sorted(allowed))}")
        if op.key in updates:
            raise ValueError(f"Duplicate quota key {op.key}")
        if op.remove:
            updates[op.key] = None
            continue
        if op.value <= 0 or (kind is int and op.value != int(op.value)):
            raise ValueError(f"Invalid value {op.value} for {op.key}: a positive {'integer' if kind is int else 'number'}")
        updates[op.key] = str(int(op.value)) if kind is int else repr(op.value)
    return path, updates

