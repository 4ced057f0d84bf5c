"""Record framing checks on produce (Kafka's LogValidator): the compiled walk and the Python
one give the same verdicts, on good batches, on the corruptions clients could send, and on
random damage."""

from __future__ import annotations

import random
import struct

import pytest
from crc32c import crc32c

from strom.protocol import compression, records
from strom.protocol.errors import InvalidRecordError
from strom.protocol.records import (
    CRC_START,
    HEADER_SIZE,
    build_batch,
    check_records_py,
    read_header,
    validate_batches,
)
from strom.protocol.varint import write_varint

WALKS = [pytest.param(check_records_py, id="python")]
if records._check_records is not None:
    WALKS.append(pytest.param(records._check_records, id="compiled"))


def test_the_compiled_walk_is_built() -> None:
    # The set-up builds it; without it produce pays Python's per-record cost.
    assert records._check_records is not None


def reseal(batch: bytearray) -> bytearray:
    """Recompute the CRC after tampering, as a hostile client would."""
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[CRC_START:])))
    return batch


def with_header_count(batch: bytes, count: int) -> bytearray:
    out = bytearray(batch)
    struct.pack_into(">i", out, 23, count - 1)  # last offset delta
    struct.pack_into(">i", out, 57, count)  # record count
    return reseal(out)


def body_verdict(walk, batch: bytes, require_keys: bool = False):
    header = read_header(batch)
    return walk(batch, HEADER_SIZE, header.size, header.record_count, require_keys)


@pytest.mark.parametrize("walk", WALKS)
def test_good_batches_pass(walk) -> None:
    batch = build_batch([(b"k%d" % i, b"v" * i) for i in range(50)] + [(None, None)])
    assert body_verdict(walk, batch) is None
    rec = records.Record(7, 1000, b"key", b"value", (("h1", b"x"), ("h2", None)))
    assert body_verdict(walk, build_batch([rec], base_offset=7, timestamp=1000)) is None


@pytest.mark.parametrize("walk", WALKS)
def test_count_above_the_records_is_refused(walk) -> None:
    batch = with_header_count(build_batch([(b"k", b"v")]), 2**31 - 1)
    index, reason = body_verdict(walk, batch)
    assert index == 1 and "fewer records" in reason


@pytest.mark.parametrize("walk", WALKS)
def test_records_past_the_count_are_refused(walk) -> None:
    batch = with_header_count(build_batch([(b"k", b"v")] * 3), 2)
    assert body_verdict(walk, batch) == (1, "bytes left after the last record the batch header counts")


@pytest.mark.parametrize("walk", WALKS)
def test_random_record_bytes_are_refused(walk) -> None:
    rng = random.Random(7)
    batch = bytearray(build_batch([(b"k", b"v" * 40)] * 4))
    refused = 0
    for _ in range(200):
        tampered = bytearray(batch)
        tampered[HEADER_SIZE:] = rng.randbytes(len(batch) - HEADER_SIZE)
        refused += body_verdict(walk, reseal(tampered)) is not None
    assert refused >= 195  # random bytes almost never frame 4 records exactly


@pytest.mark.parametrize("walk", WALKS)
def test_keyless_records_refused_only_when_keys_are_required(walk) -> None:
    batch = build_batch([(b"k", b"v"), (None, b"v")])
    assert body_verdict(walk, batch) is None
    index, reason = body_verdict(walk, batch, require_keys=True)
    assert index == 1 and "without key" in reason


@pytest.mark.parametrize("walk", WALKS)
def test_negative_header_count_and_null_header_key(walk) -> None:
    def one(fields: bytes) -> bytes:
        body = write_varint(len(fields)) + fields
        batch = bytearray(build_batch([(b"k", b"v")]))
        return with_header_count(bytes(batch[:HEADER_SIZE]) + body, 1)

    def fix_length(batch: bytearray) -> bytearray:
        struct.pack_into(">i", batch, 8, len(batch) - 12)
        return reseal(batch)

    base = b"\x00" + write_varint(0) + write_varint(0) + write_varint(1) + b"k" + write_varint(1) + b"v"
    bad_count = fix_length(bytearray(one(base + write_varint(-1))))
    assert body_verdict(walk, bad_count) == (0, "negative header count")
    bad_key = fix_length(bytearray(one(base + write_varint(1) + write_varint(-1) + write_varint(-1))))
    assert body_verdict(walk, bad_key) == (0, "null header key")


def test_both_walks_agree_on_random_damage() -> None:
    if records._check_records is None:
        pytest.fail("the compiled record walk is not built")
    rng = random.Random(1234)
    good = build_batch([(b"key-%d" % i, rng.randbytes(rng.randrange(0, 90))) for i in range(30)])
    for trial in range(3000):
        batch = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            batch[rng.randrange(HEADER_SIZE, len(batch))] = rng.randrange(256)
        header = read_header(batch)
        count = rng.choice([header.record_count, header.record_count + 1, 1, 29])
        for keys in (False, True):
            compiled = records._check_records(batch, HEADER_SIZE, len(batch), count, keys)
            python = check_records_py(batch, HEADER_SIZE, len(batch), count, keys)
            assert (compiled is None) == (python is None), (trial, compiled, python)
            if compiled is not None:
                assert compiled[0] == python[0], (trial, compiled, python)


@pytest.mark.parametrize("codec", [compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD])
def test_compressed_batches_are_walked_after_decompression(codec) -> None:
    good = build_batch([(b"k", b"v" * 100)] * 10, codec=codec)
    assert [h.record_count for _, h in validate_batches(good, 1 << 20, check_records=True)] == [10]
    with pytest.raises(InvalidRecordError, match="fewer records"):
        validate_batches(with_header_count(good, 11), 1 << 20, check_records=True)
    garbage = bytearray(good)
    garbage[HEADER_SIZE:] = b"\x00not a compressed frame\xff" * 4
    struct.pack_into(">i", garbage, 8, len(garbage) - 12)
    with pytest.raises(InvalidRecordError):
        validate_batches(reseal(garbage), 1 << 20, check_records=True)


def test_record_index_counts_across_batches() -> None:
    first = build_batch([(b"a", b"1"), (b"b", b"2")])
    second = build_batch([(b"c", b"3"), (None, b"4")])
    with pytest.raises(InvalidRecordError) as refused:
        validate_batches(bytearray(first + second), 1 << 20, check_records=True, require_keys=True)
    assert refused.value.record_index == 3


# -- the schema registry's framing of keys and values (schema validation on produce)

def _framed(schema_id: int, payload: bytes = b"payload") -> bytes:
    return b"\0" + schema_id.to_bytes(4, "big") + payload


SCHEMA_ID_CASES = [
    # (records as (key, value), expected value answer, expected key answer)
    ([(None, _framed(7)), (b"k", _framed(7)), (None, _framed(9))], ((7, 9), []), ((), [1])),
    ([(_framed(3), None), (_framed(3), b"\1\0\0\0\1x"), (b"", b"ab")], ((), [1, 2]), ((3,), [2])),
    ([(None, b"\0\0\0\0"), (None, _framed(0, b""))], ((0,), [0]), ((), [])),
]


@pytest.mark.parametrize("codec", [compression.NONE, compression.ZSTD])
@pytest.mark.parametrize("rows, by_value, by_key", SCHEMA_ID_CASES)
def test_schema_ids_of_values_and_keys(rows, by_value, by_key, codec) -> None:
    batch = build_batch(rows, codec=codec)
    header = read_header(batch, 0)
    view = memoryview(batch)
    assert records.batch_schema_ids(view, 0, header, True) == (by_value[0], by_value[1])
    assert records.batch_schema_ids(view, 0, header, False) == (by_key[0], by_key[1])
    for schema_id in by_value[0]:
        named = records.batch_records_with_schema_id(view, 0, header, True, schema_id)
        assert named == [i for i, (_, v) in enumerate(rows) if v is not None and v[:5] == _framed(schema_id, b"")]


def test_schema_ids_compiled_and_python_agree_on_damage() -> None:
    assert records._schema_ids is not None  # the set-up builds it
    rng = random.Random(11)
    for _ in range(300):
        rows = [(None, _framed(rng.randrange(4)) if rng.random() < 0.8 else b"x") for _ in range(rng.randrange(1, 6))]
        body = bytearray(build_batch(rows)[HEADER_SIZE:])
        for _ in range(rng.randrange(3)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        count = len(rows)
        python = records.record_schema_ids(body, 0, len(body), count, True)
        compiled = records._schema_ids(bytes(body), 0, len(body), count, True)
        if python is None:
            assert compiled is None
        else:
            assert compiled == (tuple(dict.fromkeys(i for i in python if i is not None and i >= 0)),
                                [n for n, i in enumerate(python) if i == -1])


def test_schema_ids_beyond_what_the_compiled_walk_keeps() -> None:
    rows = [(None, _framed(n)) for n in range(100)]
    batch = build_batch(rows)
    ids, unframed = records.batch_schema_ids(memoryview(batch), 0, read_header(batch, 0), True)
    assert ids == tuple(range(100)) and unframed == []


# -- the compiled check of a whole record set (validate_batches) and its CRC-32C

def test_compiled_crc32c_matches_the_library() -> None:
    rng = random.Random(7)
    for size in [0, 1, 7, 8, 9, 61, 255, 4096, 100_003]:
        data = rng.randbytes(size)
        assert records._crc32c(data) == records._crc32c(data, True) == crc32c(data), size


def _verdict(check, buf: bytearray, max_bytes: int, check_records: bool, require_keys: bool):
    try:
        return [(pos, h) for pos, h in check(buf, max_bytes, check_records=check_records, require_keys=require_keys)]
    except (InvalidRecordError, records.CorruptRecordError, records.RecordTooLargeError) as e:
        return (type(e), str(e), getattr(e, "record_errors", None))


def test_compiled_set_check_agrees_with_python_on_random_damage() -> None:
    """validate_batches (compiled where the set passes) against validate_batches_py: the same
    batches and headers, or the same error, over sets of several batches (one compressed) with
    headers, lengths, counts and records damaged and some CRCs mended."""
    assert records._validate_batches is not None, "the compiled set check is not built"
    rng = random.Random(99)
    parts = [build_batch([(b"k%d" % i, rng.randbytes(rng.randrange(40))) for i in range(5)]),
             build_batch([(None, b"v" * 50)] * 3, codec=compression.LZ4),
             build_batch([(b"x", b"y")])]
    good = bytearray(b"".join(parts))
    starts = [0, len(parts[0]), len(parts[0]) + len(parts[1])]
    accepted = 0
    for trial in range(3000):
        buf = bytearray(good[:rng.choice([len(good)] * 6 + [rng.randrange(len(good))])])
        for _ in range(rng.randrange(0, 3)):
            buf[rng.randrange(len(buf))] = rng.choice([0, 2, 0x7F, 0xFF, rng.randrange(256)])
        if rng.random() < 0.5:  # mended, as a hostile client would: the damage is then past the CRC
            for start in starts:
                end = start + 12 + int.from_bytes(good[start + 8:start + 12], "big")
                if end <= len(buf):
                    struct.pack_into(">I", buf, start + 17, crc32c(bytes(buf[start + CRC_START:end])))
        for check_records, keys in ((True, False), (True, True), (False, False)):
            max_bytes = rng.choice([1 << 20, 200])
            compiled = _verdict(validate_batches, bytearray(buf), max_bytes, check_records, keys)
            python = _verdict(records.validate_batches_py, bytearray(buf), max_bytes, check_records, keys)
            assert compiled == python, trial
            accepted += isinstance(compiled, list)
    assert accepted > 300


@pytest.mark.parametrize("check_records", [False, True])
def test_large_batches_crcs_are_checked_too(check_records) -> None:
    """Batches over 4 KiB have their CRC checked by the crc32c library, after the compiled
    check: a damaged value byte (framing intact) is still CORRUPT_MESSAGE, and the batch
    before it in the set does not hide it."""
    small = build_batch([(b"k", b"v")])
    large = bytearray(build_batch([(b"k", b"x" * 6000)]))
    assert len(large) > 4096
    assert [h.record_count for _, h in validate_batches(bytearray(small + large), 1 << 20,
                                                         check_records=check_records)] == [1, 1]
    large[-100] ^= 0x01  # inside the value: the records still frame, only the CRC can tell
    with pytest.raises(records.CorruptRecordError, match="CRC mismatch"):
        validate_batches(bytearray(small + large), 1 << 20, check_records=check_records)
