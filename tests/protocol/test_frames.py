import struct

import pytest

from strom.protocol.frames import FrameDecoder, FrameTooLarge, InvalidFrame, frame


def test_small_frames_split_anywhere():
    data = frame(b"abc") + frame(b"") + frame(b"hello world")
    for cut in range(len(data) + 1):
        dec = FrameDecoder(1024)
        got = dec.feed(data[:cut]) + dec.feed(data[cut:])
        assert [bytes(f) for f in got] == [b"abc", b"", b"hello world"]


def test_large_frame_filled_in_place():
    payload = bytes(range(256)) * 1000  # bigger than the scratch buffer
    dec = FrameDecoder(10**6)
    data = frame(payload) + frame(b"next")
    got = []
    for i in range(0, len(data), 7000):
        got += dec.feed(data[i : i + 7000])
    assert [bytes(f) for f in got] == [payload, b"next"]


def test_frame_over_limit_rejected():
    with pytest.raises(FrameTooLarge):
        FrameDecoder(100).feed(struct.pack(">i", 101))


def test_negative_size_rejected():
    with pytest.raises(InvalidFrame):
        FrameDecoder(100).feed(struct.pack(">i", -5))


def test_a_large_announced_frame_costs_only_what_arrived():
    """A header announcing 100 MB followed by 14 bytes must not reserve 100 MB; the buffer
    grows as the bytes come, and the frame is exact at the end."""
    decoder = FrameDecoder(200 << 20)
    announced = 100 << 20
    assert decoder.feed(struct.pack(">i", announced) + b"x" * (1 << 17)) == []
    assert len(decoder.get_buffer()) <= 1 << 20  # not 100 MB
    payload = bytes(range(256)) * (3 << 12)  # 3 MB more, spread over several growths
    assert decoder.feed(payload) == []
    rest = announced - (1 << 17) - len(payload)
    frames = decoder.feed(b"z" * rest)
    assert len(frames) == 1 and len(frames[0]) == announced
    assert frames[0][: 1 << 17] == b"x" * (1 << 17) and frames[0][1 << 17 : (1 << 17) + len(payload)] == payload
