"""The remote stores behind log.remote's interface, each against the real thing: a directory,
and a real S3 server (SeaweedFS on 127.0.0.1). The same checks for both: a segment copied
with its indexes, read back whole and by byte ranges, deleted (twice), and what is missing
said as RemoteResourceNotFound; then what only S3 has (its config keys, wrong credentials)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from strom.log.remote import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemoteResourceNotFound,
    RemoteStorageError,
)
from strom.remote import storage_from_config
from strom.remote.config import RemoteStorageConfigError
from strom.remote.directory import DirectoryStorage
from strom.remote.objects import object_key
from strom.remote.s3 import S3Storage
from strom.s3_server import S3Server
from strom.testing import free_ports

TOPIC_ID = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")


@pytest.fixture(scope="module")
def s3_server():
    with S3Server(ports=free_ports) as server:
        yield server


@pytest.fixture(params=["directory", "s3"])
def storage(request, tmp_path):
    if request.param == "directory":
        yield DirectoryStorage(tmp_path / "remote", key_prefix="tiered/")
    else:
        server = request.getfixturevalue("s3_server")
        yield storage_from_config(server.rsm_config(key_prefix=f"{uuid.uuid4().hex[:8]}/"))


def segment(tmp_path: Path, records: bytes, with_txn_index: bool = True) -> LogSegmentData:
    files = {}
    for name, content in (("log", records), ("index", b"offset-index"), ("timeindex", b"time-index"),
                          ("txnindex", b"txn-index"), ("snapshot", b"producer-snapshot")):
        files[name] = tmp_path / f"00000000000000000100.{name}"
        files[name].write_bytes(content)
    return LogSegmentData(files["log"], files["index"], files["timeindex"],
                          files["txnindex"] if with_txn_index else None, files["snapshot"], b"0\n1\n3 100\n")


def metadata(start: int = 100) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(TOPIC_ID, "clicks", 2), start, start + 9, 1_700_000_000_000,
                                    1, 1_700_000_000_500, ((3, start),), 4096)


def test_a_copied_segment_reads_back_whole_by_range_and_by_index(storage, tmp_path):
    records = bytes(range(256)) * 16
    meta = metadata()
    storage.copy_log_segment_data(meta, segment(tmp_path, records))
    assert storage.fetch_log_segment(meta, 0) == records
    assert storage.fetch_log_segment(meta, 1000) == records[1000:]
    assert storage.fetch_log_segment(meta, 10, 300) == records[10:300]
    assert storage.fetch_log_segment(meta, 4000, 4096) == records[4000:]
    assert storage.fetch_log_segment(meta, 5, 5) == b""
    assert storage.fetch_index(meta, IndexType.OFFSET) == b"offset-index"
    assert storage.fetch_index(meta, IndexType.TIMESTAMP) == b"time-index"
    assert storage.fetch_index(meta, IndexType.TRANSACTION) == b"txn-index"
    assert storage.fetch_index(meta, IndexType.PRODUCER_SNAPSHOT) == b"producer-snapshot"
    assert storage.fetch_index(meta, IndexType.LEADER_EPOCH) == b"0\n1\n3 100\n"
    with pytest.raises(ValueError):
        storage.fetch_log_segment(meta, 10, 5)


def test_each_copy_attempt_has_objects_of_its_own(storage, tmp_path):
    """A retried copy is a new segment id: it never overwrites what another attempt wrote, and
    deleting one attempt leaves the other whole."""
    first, second = metadata(), metadata()
    assert first.segment_id != second.segment_id
    storage.copy_log_segment_data(first, segment(tmp_path, b"first"))
    storage.copy_log_segment_data(second, segment(tmp_path, b"second"))
    storage.delete_log_segment_data(first)
    assert storage.fetch_log_segment(second, 0) == b"second"
    with pytest.raises(RemoteResourceNotFound):
        storage.fetch_log_segment(first, 0)


def test_deletion_removes_every_object_and_may_be_repeated(storage, tmp_path):
    meta = metadata(500)
    storage.copy_log_segment_data(meta, segment(tmp_path, b"records", with_txn_index=False))
    with pytest.raises(RemoteResourceNotFound):  # no aborted transactions: no transaction index
        storage.fetch_index(meta, IndexType.TRANSACTION)
    storage.delete_log_segment_data(meta)
    storage.delete_log_segment_data(meta)  # a deletion interrupted by a crash is done again
    for index in IndexType:
        with pytest.raises(RemoteResourceNotFound):
            storage.fetch_index(meta, index)
    with pytest.raises(RemoteResourceNotFound):
        storage.fetch_log_segment(meta, 0)


def test_object_keys_list_a_partition_together_in_offset_order():
    early, late = metadata(100), metadata(2_000)
    keys = [object_key("p/", m, ".log") for m in (late, early)]
    assert sorted(keys) == keys[::-1]
    assert keys[1].startswith("p/clicks-a6e4EJ2tEdGAtADAT9QwyA/2/00000000000000000100-")
    assert early.with_state(RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1).state == 1


def test_the_directory_store_keeps_objects_inside_its_root(tmp_path):
    store = DirectoryStorage(tmp_path / "root")
    with pytest.raises(RemoteStorageError):
        store.put("../outside", b"x")
    assert not (tmp_path / "outside").exists()


def test_the_store_is_chosen_by_aivens_keys(tmp_path, s3_server):
    directory = storage_from_config({
        "rsm.config.storage.backend.class": "io.aiven.kafka.tieredstorage.storage.filesystem.FileSystemStorage",
        "rsm.config.storage.root": str(tmp_path)})
    assert isinstance(directory, DirectoryStorage) and directory.root == tmp_path
    s3 = storage_from_config(s3_server.rsm_config())
    assert isinstance(s3, S3Storage) and s3.bucket == s3_server.bucket
    assert isinstance(storage_from_config({"rsm.config.storage.s3.bucket.name": "b",
                                           "rsm.config.storage.s3.region": "eu-west-1"}), S3Storage)
    with pytest.raises(RemoteStorageConfigError, match="bucket.name"):
        storage_from_config({"rsm.config.storage.backend.class": "io.aiven.kafka.tieredstorage.storage.s3.S3Storage"})
    with pytest.raises(RemoteStorageConfigError, match="no remote store"):
        storage_from_config({})
    with pytest.raises(RemoteStorageConfigError, match="true or false"):
        storage_from_config({**s3_server.rsm_config(), "rsm.config.storage.s3.path.style.access.enabled": "yes"})


def test_s3_with_the_wrong_secret_is_refused_as_an_error_not_a_missing_object(s3_server, tmp_path):
    config = {**s3_server.rsm_config(), "rsm.config.storage.aws.secret.access.key": "wrong"}
    store = storage_from_config(config)
    with pytest.raises(RemoteStorageError) as raised:
        store.copy_log_segment_data(metadata(), segment(tmp_path, b"x"))
    assert not isinstance(raised.value, RemoteResourceNotFound)
    assert "wrong" not in str(raised.value)  # the secret is not echoed
