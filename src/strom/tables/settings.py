"""The broker's iceberg.* keys as what the catalog and the translators need: pyiceberg catalog
properties, the namespace, the commit interval; and how the schema modes reach the registry.
Pure: nothing here imports pyiceberg."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A translated batch is committed early once its records take this many bytes (the bound on
# what a partition's translator holds between commits).
COMMIT_MAX_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class IcebergSettings:
    catalog_name: str
    catalog_properties: dict[str, str]
    namespace: str
    commit_interval_s: float
    warehouse: str | None
    commit_max_bytes: int = COMMIT_MAX_BYTES


def iceberg_settings(config: Any) -> IcebergSettings:
    """From a BrokerConfig: the catalog's properties (sql: the SQLAlchemy URL, by default SQLite
    under the first log dir; rest: the endpoint), the warehouse (sql: by default a directory
    under the first log dir; rest: the catalog's unless set; an s3:// one reached as tiered
    storage reaches its bucket), and the iceberg.catalog.<key> pass-through."""
    base: Path = Path(config.log_dirs[0]).absolute() / "iceberg"
    kind = config["iceberg.catalog.type"]
    uri = config["iceberg.catalog.uri"]
    if uri is None and kind == "sql":
        uri = f"sqlite:///{base / 'catalog.db'}"
    warehouse = config["iceberg.warehouse"]
    if warehouse is None and kind == "sql":  # a REST catalog knows its own warehouse
        warehouse = (base / "warehouse").as_uri()
    props: dict[str, str] = {"type": kind}
    if warehouse:
        props["warehouse"] = warehouse
    if uri is not None:
        props["uri"] = uri
    if warehouse and warehouse.startswith(("s3://", "s3a://")):
        props.update(_s3_properties(config.remote_storage_props(), config["remote.log.storage.manager.impl.prefix"]))
    props.update(config.iceberg_catalog_props)
    return IcebergSettings(config["iceberg.catalog.name"], props, config["iceberg.namespace"],
                           config["iceberg.commit.interval.ms"] / 1000, warehouse=warehouse)


def _s3_properties(remote: dict[str, str], prefix: str) -> dict[str, str]:
    """pyiceberg's S3 FileIO properties from tiered storage's rsm.config.storage.* keys."""
    keys = {k[len(prefix):]: v for k, v in remote.items() if k.startswith(prefix)}
    names = {"storage.s3.endpoint.url": "s3.endpoint", "storage.s3.region": "s3.region",
             "storage.aws.access.key.id": "s3.access-key-id",
             "storage.aws.secret.access.key": "s3.secret-access-key"}
    props = {ours: keys[theirs] for theirs, ours in names.items() if keys.get(theirs)}
    if keys.get("storage.s3.path.style.access.enabled", "").strip().lower() == "true":
        props["s3.force-virtual-addressing"] = "false"
    return props


@dataclass(frozen=True)
class SchemaSource:
    """The broker's schema registry as the schema modes read it, in blocking calls made from
    the translators' executor. `schemas(ids)`: id -> parsed schema, or the reason as text.
    `latest(subject)`: (id, parsed schema, ids of the subject's live versions), or None while
    the subject has none."""

    schemas: Callable[[Collection[int]], dict[int, Any]]
    latest: Callable[[str], tuple[int, Any, frozenset[int]] | None]
