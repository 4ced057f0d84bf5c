"""A remote store from the `rsm.config.*` keys of a broker (the prefix is
remote.log.storage.manager.impl.prefix), named as Aiven's tiered-storage plugin for Kafka names
them, so that a Kafka operator's broker config carries over:

    rsm.config.storage.backend.class   ...s3.S3Storage, or ...filesystem.FileSystemStorage
    rsm.config.storage.s3.bucket.name, .endpoint.url, .region, .path.style.access.enabled
    rsm.config.storage.aws.access.key.id, rsm.config.storage.aws.secret.access.key
    rsm.config.storage.root            the directory store's root
    rsm.config.key.prefix              put before every object key
    rsm.config.storage.s3.api.call.timeout, .api.call.attempt.timeout   (ms) bound a call

Without a backend class, a bucket name means S3 and a root the directory store. Aiven's other
keys (chunking, compression, encryption) have no use here and are ignored."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from strom.remote.objects import ObjectStorage

DEFAULT_PREFIX = "rsm.config."


class RemoteStorageConfigError(ValueError):
    pass


def storage_from_config(config: Mapping[str, str], prefix: str = DEFAULT_PREFIX) -> ObjectStorage:
    keys = {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}
    backend = keys.get("storage.backend.class", "").lower()
    key_prefix = keys.get("key.prefix", "")
    s3 = "s3" in backend.rsplit(".", 1)[-1] or (not backend and "storage.s3.bucket.name" in keys)
    directory = "filesystem" in backend or backend == "directory" or (not backend and "storage.root" in keys)
    if s3:
        from strom.remote.s3 import S3Storage

        bucket = keys.get("storage.s3.bucket.name")
        if not bucket:
            raise RemoteStorageConfigError(f"{prefix}storage.s3.bucket.name is required for S3 remote storage")
        return S3Storage(bucket, endpoint_url=keys.get("storage.s3.endpoint.url") or None,
                         region=keys.get("storage.s3.region") or None,
                         path_style=_flag(keys, "storage.s3.path.style.access.enabled", prefix),
                         access_key_id=keys.get("storage.aws.access.key.id") or None,
                         secret_access_key=keys.get("storage.aws.secret.access.key") or None,
                         key_prefix=key_prefix,
                         api_call_timeout_ms=_millis(keys, "storage.s3.api.call.timeout", prefix),
                         attempt_timeout_ms=_millis(keys, "storage.s3.api.call.attempt.timeout", prefix))
    if directory:
        from strom.remote.directory import DirectoryStorage

        root = keys.get("storage.root")
        if not root:
            raise RemoteStorageConfigError(f"{prefix}storage.root is required for directory remote storage")
        return DirectoryStorage(Path(root), key_prefix)
    raise RemoteStorageConfigError(
        f"no remote store configured: set {prefix}storage.backend.class (an S3 or filesystem storage class), "
        f"or {prefix}storage.s3.bucket.name, or {prefix}storage.root")


def _millis(keys: Mapping[str, str], key: str, prefix: str) -> int | None:
    value = keys.get(key)
    if value is None:
        return None
    if not value.strip().isdigit() or int(value) <= 0:
        raise RemoteStorageConfigError(f"{prefix}{key} must be a positive number of milliseconds, not {value!r}")
    return int(value)


def _flag(keys: Mapping[str, str], key: str, prefix: str) -> bool:
    value = keys.get(key, "false").strip().lower()
    if value not in ("true", "false"):
        raise RemoteStorageConfigError(f"{prefix}{key} must be true or false, not {value!r}")
    return value == "true"
