"""The registry's wire framing of a value: magic byte 0, a 4-byte big-endian schema id."""

import pytest

from strom.schemas import HEADER_SIZE, NotFramed, frame, payload_of, schema_id_of


def test_a_framed_value_names_its_schema_and_keeps_its_payload():
    value = frame(70000, b"\x02hi")
    assert value == b"\x00\x00\x01\x11\x70\x02hi"
    assert schema_id_of(value) == 70000
    assert bytes(payload_of(value)) == b"\x02hi"
    assert HEADER_SIZE == 5


@pytest.mark.parametrize("value", [b"", b"\x00\x00\x00\x01", b"\x01\x00\x00\x00\x01payload"])
def test_what_is_not_framed_is_refused(value):
    with pytest.raises(NotFramed):
        schema_id_of(value)
    with pytest.raises(NotFramed):
        payload_of(value)
