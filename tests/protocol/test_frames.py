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


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_a_large_announced_frame_costs_only_what_arrived():
    """A header announcing 100 MB followed by some bytes must not take 100 MB; memory grows
    as the bytes come, and the frame is exact at the end."""
    decoder = FrameDecoder(200 << 20)
    announced = 100 << 20
    before = _rss_mb()
    assert decoder.feed(struct.pack(">i", announced) + b"x" * (1 << 17)) == []
    payload = bytes(range(256)) * (3 << 12)  # 3 MB more
    assert decoder.feed(payload) == []
    assert _rss_mb() - before < 40  # about 3 MB, not 100
    rest = announced - (1 << 17) - len(payload)
    frames = decoder.feed(b"z" * rest)
    assert len(frames) == 1 and len(frames[0]) == announced
    assert frames[0][: 1 << 17] == b"x" * (1 << 17) and frames[0][1 << 17 : (1 << 17) + len(payload)] == payload


def test_a_large_frame_takes_no_buffer_before_it_is_admitted():
    """2,000 connections announcing 1 MiB frames and sending 10 bytes of each: the decoders
    hold those bytes, not a buffer each (that was 1 MiB apiece, 2 GB in all)."""
    import tracemalloc

    start = struct.pack(">i", (1 << 20) + 5) + b"0123456789"
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        decoders = [FrameDecoder(100 << 20) for _ in range(2000)]
        for d in decoders:
            buf = d.get_buffer()
            buf[: len(start)] = start
            assert d.buffer_updated(len(start)) == []
            assert d.awaiting_admission == (1 << 20) + 5
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2000 * 1024, f"{held / 2000:.0f} bytes per decoder"
    # Once admitted, the frame is received as before, what came first included.
    d = decoders[0]
    assert d.admit() == [] and not d.awaiting_admission
    rest = bytes(range(256)) * 4096 + b"abcde"
    got = d.feed(rest[10:] + frame(b"next"))
    assert [bytes(f) for f in got] == [b"0123456789" + rest[10:], b"next"]


def test_bytes_beyond_an_unadmitted_frame_wait_with_it():
    """Reads that came before reading paused may hold the whole large frame and the start of
    the next ones: admission hands back what they complete, in order."""
    payload = b"p" * 70_000
    dec = FrameDecoder(1 << 20)
    data = frame(b"a") + frame(payload) + frame(b"b") + frame(payload)[:10]
    got = []
    for i in range(0, len(data), 30_000):
        buf = dec.get_buffer()
        chunk = data[i : i + 30_000]
        buf[: len(chunk)] = chunk
        got += dec.buffer_updated(len(chunk))
    assert [bytes(f) for f in got] == [b"a"]
    assert dec.awaiting_admission == len(payload)
    assert [bytes(f) for f in dec.admit()] == [payload, b"b"]
    assert dec.awaiting_admission == len(payload)  # the next one waits its own turn
    assert dec.admit() == [] and dec.feed(frame(payload)[10:]) == [bytearray(payload)]
