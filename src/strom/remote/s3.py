"""Remote storage in an S3 bucket (AWS S3 or any S3-compatible store: MinIO, SeaweedFS, Ceph),
through obstore. Objects are written with one PUT each (whole or not at all) and read with
ranged GETs; the client retries what S3 answers with a 5xx or a throttle, with backoff."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from strom.log.remote import RemoteResourceNotFound, RemoteStorageError
from strom.remote.objects import ObjectStorage, read_content


class S3Storage(ObjectStorage):
    def __init__(self, bucket: str, *, endpoint_url: str | None = None, region: str | None = None,
                 path_style: bool = False, access_key_id: str | None = None,
                 secret_access_key: str | None = None, key_prefix: str = "") -> None:
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
        client_options = {"allow_http": True} if endpoint_url and endpoint_url.startswith("http://") else {}
        self.bucket = bucket
        self._store = S3Store(bucket, client_options=client_options, **options)

    def put(self, key: str, content: Path | bytes) -> None:
        import obstore

        try:
            obstore.put(self._store, key, read_content(content))
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
