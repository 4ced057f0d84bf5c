"""Remote storage in an S3 bucket (AWS S3 or any S3-compatible store: MinIO, SeaweedFS, Ceph),
through obstore. Objects are written with one PUT each (whole or not at all) and read with
ranged GETs; the client retries what S3 answers with a 5xx or a throttle, with backoff."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from strom.log.remote import RemoteResourceNotFound, RemoteStorageError
from strom.remote.objects import ObjectStorage

PUT_PARTS_IN_FLIGHT = 4  # of obstore's 5 MiB parts: the memory one upload holds


class S3Storage(ObjectStorage):
    def __init__(self, bucket: str, *, endpoint_url: str | None = None, region: str | None = None,
                 path_style: bool = False, access_key_id: str | None = None,
                 secret_access_key: str | None = None, key_prefix: str = "",
                 api_call_timeout_ms: int | None = None, attempt_timeout_ms: int | None = None) -> None:
        super().__init__(key_prefix)
        try:
            from obstore.store import S3Store
        except ImportError as e:  # an optional dependency: `pip install strom[tiered]`
            raise RemoteStorageError("S3 remote storage needs obstore (pip install 'strom[tiered]')") from e
        options: dict[str, Any] = {"virtual_hosted_style_request": not path_style}
        if endpoint_url:
            options["endpoint"] = endpoint_url
        if region:
            options["region"] = region
        if access_key_id:
            options["access_key_id"] = access_key_id
        if secret_access_key:
            options["secret_access_key"] = secret_access_key
        client_options: dict[str, Any] = {"allow_http": True} if endpoint_url and endpoint_url.startswith("http://") else {}
        # Aiven's storage.s3.api.call.attempt.timeout bounds one attempt, api.call.timeout all
        # attempts with their backoff: a store that stopped answering fails a call in bounded time.
        if attempt_timeout_ms:
            client_options["timeout"] = timedelta(milliseconds=attempt_timeout_ms)
        retry: dict[str, Any] = {}
        if api_call_timeout_ms:
            retry["retry_timeout"] = timedelta(milliseconds=api_call_timeout_ms)
        self.bucket = bucket
        self._store = S3Store(bucket, client_options=client_options, retry_config=retry or None, **options)

    def put(self, key: str, content: Path | bytes) -> None:
        import obstore

        try:
            # a file streams in multipart chunks (a few in flight), never whole in memory
            obstore.put(self._store, key, content if isinstance(content, Path) else bytes(content),
                        max_concurrency=PUT_PARTS_IN_FLIGHT)
        except Exception as e:  # obstore raises its own error types for every failure
            raise RemoteStorageError(f"cannot write s3://{self.bucket}/{key}: {_short(e)}") from e

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        import obstore

        try:
            if start == 0 and end is None:
                return bytes(obstore.get(self._store, key).bytes())
            if end is None:
                return bytes(obstore.get(self._store, key, options={"range": {"offset": start}}).bytes())
            if end <= start:
                return b""
            return bytes(obstore.get_range(self._store, key, start=start, end=end))
        except FileNotFoundError:
            raise RemoteResourceNotFound(f"no object s3://{self.bucket}/{key}") from None
        except Exception as e:
            raise RemoteStorageError(f"cannot read s3://{self.bucket}/{key}: {_short(e)}") from e

    def delete(self, key: str) -> None:
        import obstore

        try:
            obstore.delete(self._store, key)  # S3 answers a missing key's DELETE with success
        except FileNotFoundError:
            pass
        except Exception as e:
            raise RemoteStorageError(f"cannot delete s3://{self.bucket}/{key}: {_short(e)}") from e


def _short(e: Exception) -> str:
    """obstore's messages carry a multi-line debug dump: its first line says what happened."""
    return str(e).split("\n", 1)[0]
