"""The compiled metadata record codec against kafka-python's generic one (both read the same
schemas): equal bytes for every record type and version, each decoding the other's output, and
Kafka's ApiMessageAndVersion framing."""

from __future__ import annotations

import json
import random
import uuid
from importlib import resources

import pytest
from kafka.protocol.api_data import ApiData

from strom.metadata import records
from strom.protocol import schemas

_KP: dict[str, type] = {}


def _kafka_python_class(name: str) -> type:
    if name not in _KP:
        _KP[name] = type(name, (ApiData,), {}, load_json=schemas)
    return _KP[name]


def _random_value(field, rng: random.Random, version: int):
    el = field.element
    if field.is_array:
        if field.nullable and records._within(version, field.nullable) and rng.random() < 0.2:
            return None
        return [_random_scalar(el, field, rng, version) for _ in range(rng.randrange(4))]
    if field.nullable and records._within(version, field.nullable) and rng.random() < 0.2:
        return None
    return _random_scalar(el, field, rng, version)


def _random_scalar(el: str, field, rng: random.Random, version: int):
    bits = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
    if el in bits:
        n = bits[el]
        return rng.randrange(-(2 ** (n - 1)), 2 ** (n - 1))
    if el == "uint16":
        return rng.randrange(65536)
    if el == "float64":
        return rng.uniform(-1e6, 1e6)
    if el == "bool":
        return rng.random() < 0.5
    if el == "string":
        return "".join(rng.choice("abcdé漢-_") for _ in range(rng.randrange(12)))
    if el == "bytes":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(20)))
    if el == "uuid":
        return None if rng.random() < 0.2 else uuid.UUID(int=rng.getrandbits(128))
    return _random_struct(field.struct, rng, version)


def _random_struct(struct, rng, version):
    values = {}
    for f in struct.fields:
        if records._within(version, f.versions):
            values[f.attr] = _random_value(f, rng, version)
    return struct, values


def _build(struct_values, mine_cls, kp_cls, version):
    struct, values = struct_values
    mine_args, kp_args = {}, {}
    for f in struct.fields:
        if f.attr not in values:
            continue
        v = values[f.attr]
        if f.struct is not None:
            sub_mine = getattr(mine_cls, f.struct.name)
            sub_kp = getattr(kp_cls, f.struct.name)
            if f.is_array:
                pairs = [_build(x, sub_mine, sub_kp, version) for x in v] if v is not None else None
                mine_args[f.attr] = None if pairs is None else [p[0] for p in pairs]
                kp_args[f.attr] = None if pairs is None else [p[1] for p in pairs]
            else:
                m, k = _build(v, sub_mine, sub_kp, version)
                mine_args[f.attr], kp_args[f.attr] = m, k
        else:
            mine_args[f.attr] = v
            kp_args[f.attr] = v
    return mine_cls(**mine_args), kp_cls(version=version, **kp_args)


@pytest.mark.parametrize("api_key", sorted(records.RECORD_TYPES))
def test_compiled_codec_matches_kafka_python(api_key):
    rt = records.RECORD_TYPES[api_key]
    schema = json.loads((resources.files("strom.protocol.schemas") / f"{rt.name}.json").read_text())
    schema_root = records._parse_struct(rt.name, schema["fields"], {})
    if not schema["fields"]:  # kafka-python cannot build an empty struct: the framing alone
        assert records.encode(rt.cls()) == bytes([1, api_key, 0, 0])
        assert type(records.decode(bytes([1, api_key, 0, 0]))) is rt.cls
        return
    kp_cls = _kafka_python_class(rt.name)
    # Kafka writes tagged fields in ascending tag order; kafka-python in declaration order.
    in_order = _declared_in_tag_order(schema_root)
    rng = random.Random(api_key)
    for version in range(rt.max_version + 1):
        for _ in range(30):
            mine, kp = _build(_random_struct(schema_root, rng, version), rt.cls, kp_cls, version)
            framed = records.encode(mine, version)
            theirs = bytes(kp.encode(version=version, header=False))
            prefix = b"\x01" + records._uv_bytes(api_key) + records._uv_bytes(version)
            if in_order:
                assert framed == prefix + theirs, (rt.name, version, mine)
            key, ver, back = records.decode_framed(framed)
            assert (key, ver) == (api_key, version)
            assert back == mine
            assert records.decode(prefix + theirs) == mine
            assert kp_cls.decode(framed[len(prefix):], version=version, header=False) == kp


def _declared_in_tag_order(struct) -> bool:
    tags = [f.tag for f in struct.fields if f.tag is not None]
    return tags == sorted(tags) and all(_declared_in_tag_order(f.struct) for f in struct.fields if f.struct)


def test_kafka_framing_and_versions_written():
    tid = uuid.UUID("01234567-89ab-cdef-0123-456789abcdef")
    value = records.encode(records.TopicRecord(name="t", topic_id=tid))
    # frame version 1, TopicRecord is type 2, version 0; compact string "t"; the uuid; no tags
    assert value == bytes([1, 2, 0, 2]) + b"t" + tid.bytes + b"\x00"
    part = records.PartitionRecord(partition_id=0, topic_id=tid, replicas=[1], isr=[1], leader=1,
                                   leader_epoch=0, partition_epoch=0, directories=[None])
    assert records.decode_framed(records.encode(part))[:2] == (3, 1)  # v1: with directories
    change = records.PartitionChangeRecord(partition_id=0, topic_id=tid, isr=[1, 2])
    key, version, back = records.decode_framed(records.encode(change))
    assert (key, version) == (5, 1) and back.leader == -2 and back.replicas is None


def test_bad_values_are_refused():
    good = records.encode(records.NoOpRecord())
    with pytest.raises(ValueError, match="frame version"):
        records.decode(b"\x02" + good[1:])
    with pytest.raises(ValueError, match="unknown metadata record type"):
        records.decode(bytes([1, 99, 0, 0]))
    with pytest.raises(ValueError):
        records.decode(records.encode(records.TopicRecord(name="abc"))[:-5])
    with pytest.raises(ValueError, match="bytes after"):
        records.decode(good + b"\x00")


def test_value_batches_are_build_batch_bytes_and_read_back():
    import os

    from strom.protocol.records import build_batch, build_value_batch, iter_records, iter_values

    values = [b"", b"x", os.urandom(200), os.urandom(70_000)] + [os.urandom(90) for _ in range(1500)]
    fast = build_value_batch(values, base_offset=7, timestamp=1234)
    assert fast == build_batch([(None, v) for v in values], base_offset=7, timestamp=1234)
    assert iter_values(fast) == [r.value for r in iter_records(fast)] == values
