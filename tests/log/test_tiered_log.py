"""A tiered log (remote.storage.enable) on its own: local retention deletes only what is in remote
storage and leaves the log start where it is; reads below the local log start are refused
here (the remote log manager serves them); a truncation below the first local segment keeps the
log start and the leader epochs below it; a replica can restart at the leader's local start."""

from __future__ import annotations

import pytest

from strom.log import Log, LogConfig
from strom.protocol.errors import OffsetOutOfRangeError
from strom.protocol.records import build_value_batch


def tiered_log(tmp_path, **config) -> Log:
    log = Log.open(tmp_path / "events-0", LogConfig(segment_bytes=600, remote_storage_enable=True,
                                                    local_retention_ms=0, retention_ms=-1, **config))
    for i in range(30):  # a few batches per segment, in epochs 1 then 2
        log.append(bytearray(build_value_batch([b"value-%02d-" % i + b"x" * 100])), leader_epoch=1 if i < 15 else 2)
    return log


def test_local_retention_deletes_only_what_is_uploaded_and_keeps_the_log_start(tmp_path):
    log = tiered_log(tmp_path)
    segments = len(log.segments)
    assert segments > 4
    assert log.delete_retention_segments(now_ms=2**62) == 0  # nothing in remote storage yet
    third = log.segments[3].base_offset
    log.highest_offset_in_remote_storage = third - 1  # the first three are uploaded
    assert log.delete_retention_segments(now_ms=2**62) == 3
    assert log.log_start_offset == 0 and log.local_log_start_offset == third
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 1 << 20)
    assert log.read(third, 1 << 20).size > 0
    # the epoch cache still describes the whole log, remote part included
    assert [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.entries] == [(1, 0), (2, 15)]
    log.close()


def test_truncation_below_the_first_local_segment_keeps_what_is_in_remote_storage(tmp_path):
    log = tiered_log(tmp_path)
    log.highest_offset_in_remote_storage = log.segments[-2].base_offset - 1
    log.delete_retention_segments(now_ms=2**62)
    local_start = log.local_log_start_offset
    assert local_start > 16
    assert log.truncate_to(16)  # the leader's log diverges below this replica's local segments
    assert (log.log_start_offset, log.local_log_start_offset, log.log_end_offset) == (0, 16, 16)
    assert [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.entries] == [(1, 0), (2, 15)]
    log.close()


def test_a_replica_restarts_at_the_leaders_local_start_with_its_log_start(tmp_path):
    log = tiered_log(tmp_path)
    log.truncate_fully_and_start_at(100, log_start_offset=40)
    assert (log.log_start_offset, log.local_log_start_offset, log.log_end_offset) == (40, 100, 100)
    log.close()
    reopened = Log.open(tmp_path / "events-0", LogConfig(remote_storage_enable=True), log_start_offset=40)
    assert (reopened.log_start_offset, reopened.local_log_start_offset) == (40, 100)
    reopened.close()


def test_a_log_opened_before_its_topic_configs_starts_in_remote_storage_once_they_say_tiered(tmp_path):
    """A KRaft broker opens its logs before the metadata image brings topic configs: a tiered
    log opened as a plain one starts at its first segment, and must start at its checkpointed
    log start again when its configs arrive, or expiration would delete what lies below."""
    log = tiered_log(tmp_path)
    log.highest_offset_in_remote_storage = log.segments[2].base_offset - 1
    log.delete_retention_segments(now_ms=2**62)
    local_start = log.local_log_start_offset
    log.close()
    plain = Log.open(tmp_path / "events-0", LogConfig(), log_start_offset=0)
    assert plain.log_start_offset == local_start  # as a plain log: its first segment
    assert plain.checkpoint_start_offset == 0  # a crash now must not lose where it starts
    plain.config = LogConfig(remote_storage_enable=True)
    assert (plain.log_start_offset, plain.local_log_start_offset) == (0, local_start)
    # and the leader epochs of its remote part are still there (a remote segment is served by them)
    assert [(e.epoch, e.start_offset) for e in plain.leader_epoch_cache.entries] == [(1, 0), (2, 15)]
    plain.close()
