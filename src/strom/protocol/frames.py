"""Size-prefixed framing, sans I/O.

A Kafka frame is an int32 length followed by that many bytes. `FrameDecoder` is fed whatever
the transport read and yields complete frames. It is shaped for asyncio's BufferedProtocol:
small frames are cut out of a 64 KiB buffer; a large frame gets buffers of its own that the
transport fills directly, so a 1 MB produce request is copied once, not per chunk.

What an idle or slow client costs is bounded. Reads land in one buffer per thread (a
transport asks for a buffer only when bytes are ready and hands them over before anyone else
reads), and a connection keeps a 64 KiB buffer of its own only while it holds the start of an
unfinished frame: 2,000 idle connections hold none. A large frame is received in 1 MiB pieces,
allocated as its bytes arrive and joined once complete, so a client that announces 100 MB and
trickles it holds about what it has sent.
"""

from __future__ import annotations

import struct
import threading

_SIZE = struct.Struct(">i")
_SCRATCH = 65536
_PIECE = 1 << 20  # a large frame arrives into buffers of this size
_POOL_MAX = 64  # spare 64 KiB buffers kept for reuse (4 MiB)
_pool: list[bytearray] = []
_landing = threading.local()


def _landing_buffer() -> bytearray:
    buf = getattr(_landing, "buf", None)
    if buf is None:
        buf = _landing.buf = bytearray(_SCRATCH)
    return buf


def _take_scratch() -> bytearray:
    try:
        return _pool.pop()
    except IndexError:  # empty (or emptied by another thread since)
        return bytearray(_SCRATCH)


def _give_back(scratch: bytearray) -> None:
    if len(_pool) < _POOL_MAX:
        _pool.append(scratch)


class FrameTooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds socket.request.max.bytes={limit}")
        self.size = size
        self.limit = limit


class InvalidFrame(Exception):
    pass


class FrameDecoder:
    def __init__(self, max_frame_bytes: int, *, trusted: bool = False) -> None:
        """`trusted`: the peer is a broker we asked (a client reading responses), so a large
        frame's whole buffer is taken at once instead of piece by piece as bytes arrive."""
        self.max_frame_bytes = max_frame_bytes
        self.trusted = trusted
        self._scratch: bytearray | None = None  # held only with the start of a frame in it
        self._pending = 0  # bytes in `_scratch`
        self._landed = False  # the last buffer handed out was this thread's landing buffer
        self._pieces: list[bytearray] = []  # full pieces of the large frame being received
        self._frame: bytearray | None = None  # the piece being filled in place
        self._filled = 0  # bytes in `_frame`
        self._received = 0  # bytes of the large frame received so far
        self._size = 0  # the large frame's announced size

    @property
    def large_frame_size(self) -> int:
        """The announced size of the large frame being received (0 when none is)."""
        return self._size if self._frame is not None else 0

    def get_buffer(self) -> memoryview:
        """Where the next bytes should be read into. Fill it and call `buffer_updated` before
        asking any decoder on this thread for a buffer again."""
        if self._frame is not None:
            if self._filled == len(self._frame):  # this piece is full: start the next
                self._pieces.append(self._frame)
                self._frame = bytearray(min(_PIECE, self._size - self._received))
                self._filled = 0
            return memoryview(self._frame)[self._filled :]
        if self._scratch is not None:
            return memoryview(self._scratch)[self._pending :]
        self._landed = True
        return memoryview(_landing_buffer())

    def buffer_updated(self, n: int) -> list[bytearray]:
        """Account for `n` bytes read into the last buffer; return the frames now complete."""
        if self._frame is not None:
            self._filled += n
            self._received += n
            if self._received < self._size:
                return []
            last, self._frame = self._frame, None
            pieces, self._pieces = self._pieces, []
            return [bytearray().join([*pieces, last]) if pieces else last]
        if self._landed:
            self._landed = False
            landing = _landing_buffer()
            frames, pos = self._cut(landing, n)
            if pos < n:  # the start of a frame: keep it until the rest arrives
                self._scratch = _take_scratch()
                self._scratch[: n - pos] = landing[pos:n]
                self._pending = n - pos
            return frames
        frames, pos = self._cut(self._scratch, self._pending + n)
        self._pending += n - pos
        if not self._pending:
            _give_back(self._scratch)
            self._scratch = None
        elif pos:
            self._scratch[: self._pending] = self._scratch[pos : pos + self._pending]
        return frames

    def feed(self, data: bytes) -> list[bytearray]:
        """Convenience for callers holding plain bytes (tests, blocking clients)."""
        frames: list[bytearray] = []
        view = memoryview(data)
        while view:
            buf = self.get_buffer()
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            frames.extend(self.buffer_updated(n))
        return frames

    def _cut(self, buf: bytearray, end: int) -> tuple[list[bytearray], int]:
        """The complete frames in buf[:end] and where the unconsumed bytes start. The start of
        a large frame moves into its own buffer (consumed)."""
        frames: list[bytearray] = []
        pos = 0
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0:
                raise InvalidFrame(f"negative frame size {size}")
            if size > self.max_frame_bytes:
                raise FrameTooLarge(size, self.max_frame_bytes)
            available = end - pos - 4
            if available >= size:
                frames.append(buf[pos + 4 : pos + 4 + size])
                pos += 4 + size
                continue
            if 4 + size > _SCRATCH:
                # Too big for a 64 KiB buffer: give it buffers of its own, filled in place.
                self._frame = bytearray(size if self.trusted else min(size, max(_PIECE, available)))
                self._frame[:available] = buf[pos + 4 : end]
                self._filled = self._received = available
                self._size = size
                pos = end
            break
        return frames, pos


def frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload
