import pytest

from strom.protocol import compression
from strom.protocol.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from strom.protocol.records import (
    HEADER_SIZE,
    Record,
    assign_offsets,
    build_batch,
    iter_records,
    read_header,
    scan_valid_prefix,
    validate_batches,
)


def _two_batches():
    return build_batch([(b"k1", b"v1"), (None, b"v2")], timestamp=1000) + build_batch(
        [(b"k3", None)], timestamp=2000)


def test_header_fields():
    batch = build_batch([(b"k", b"v")] * 3, base_offset=10, timestamp=123)
    h = read_header(batch)
    assert (h.base_offset, h.last_offset, h.record_count, h.magic) == (10, 12, 3, 2)
    assert h.size == len(batch) and h.base_timestamp == 123


def test_assign_offsets_in_place_keeps_crc_valid():
    buf = bytearray(_two_batches())
    batches = validate_batches(buf, 10**6)
    assert assign_offsets(buf, batches, 500, leader_epoch=7) == 503
    again = validate_batches(buf, 10**6)  # still valid: offsets and epoch lie outside the CRC
    assert [h.base_offset for _, h in again] == [500, 502]
    assert all(h.partition_leader_epoch == 7 for _, h in again)
    assert [r.offset for r in iter_records(buf)] == [500, 501]


def test_log_append_time_restamps_and_recomputes_crc():
    buf = bytearray(build_batch([(b"k", b"v")], timestamp=5))
    batches = validate_batches(buf, 10**6)
    assign_offsets(buf, batches, 0, 0, log_append_time_ms=999)
    (_, h), = validate_batches(buf, 10**6)
    assert h.log_append_time and h.max_timestamp == 999
    assert next(iter_records(buf)).timestamp == 999


def test_crc_mismatch():
    buf = bytearray(_two_batches())
    buf[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        validate_batches(buf, 10**6)


def test_truncated_and_oversize_and_bad_magic():
    data = _two_batches()
    with pytest.raises(CorruptRecordError):
        validate_batches(data[:-3], 10**6)
    with pytest.raises(CorruptRecordError):
        validate_batches(data[: HEADER_SIZE - 1], 10**6)
    with pytest.raises(RecordTooLargeError):
        validate_batches(data, 20)
    bad = bytearray(data)
    bad[16] = 1
    with pytest.raises(InvalidRecordError):
        validate_batches(bad, 10**6)
    with pytest.raises(InvalidRecordError):
        validate_batches(b"", 10**6)


def test_scan_valid_prefix_stops_at_torn_tail():
    data = _two_batches()
    first = read_header(data).size
    batches, valid = scan_valid_prefix(data[:-5])
    assert valid == first and len(batches) == 1
    batches, valid = scan_valid_prefix(data + b"\x00" * 30)
    assert valid == len(data) and len(batches) == 2


@pytest.mark.parametrize("codec", sorted(compression.NAMES))
def test_records_decode_with_every_codec(codec):
    recs = [Record(offset=i, timestamp=100 + i, key=b"k%d" % i, value=b"v" * i,
                   headers=(("h", b"x"),)) for i in range(5)]
    batch = build_batch(recs, timestamp=100, codec=codec)
    assert read_header(batch).compression == codec
    assert list(iter_records(batch)) == recs


def test_varints_round_trip_and_reject_garbage():
    from strom.protocol.varint import (
        VarintError,
        read_uvarint,
        read_varint,
        skip_tagged_fields,
        write_uvarint,
        write_varint,
    )

    for n in (0, 1, 127, 128, 300, 2**31 - 1):
        assert read_uvarint(write_uvarint(n), 0) == (n, len(write_uvarint(n)))
    for n in (0, -1, 1, -(2**63), 2**63 - 1):
        assert read_varint(write_varint(n), 0)[0] == n
    with pytest.raises(VarintError):
        read_uvarint(b"\x80\x80", 0)
    with pytest.raises(VarintError):
        read_uvarint(b"\xff" * 10, 0)
    assert skip_tagged_fields(b"\x02\x00\x01a\x05\x00rest", 0) == 6
    with pytest.raises(VarintError):
        skip_tagged_fields(b"\x01\x00\x09ab", 0)


def test_garbled_record_body_is_corrupt():
    batch = bytearray(build_batch([(b"k", b"v")]))
    batch[HEADER_SIZE:] = b"\xff" * (len(batch) - HEADER_SIZE)
    with pytest.raises(CorruptRecordError):
        list(iter_records(batch))
