"""Size-prefixed framing, sans I/O.

A Kafka frame is an int32 length followed by that many bytes. `FrameDecoder` is fed whatever
the transport read and yields complete frames. It is shaped for asyncio's BufferedProtocol:
small frames are cut out of a shared scratch buffer; a large frame gets a buffer of its own
that the transport fills directly, so a 1 MB produce request is copied once, not per chunk.
"""

from __future__ import annotations

import struct

_SIZE = struct.Struct(">i")
_SCRATCH = 65536
# A large frame's buffer starts at this and doubles as bytes arrive: a header that announces
# 100 MB and sends nothing more costs 1 MB, not 100 MB.
_FIRST_CHUNK = 1 << 20


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
        frame's whole buffer is taken at once instead of grown as bytes arrive."""
        self.max_frame_bytes = max_frame_bytes
        self.trusted = trusted
        self._scratch = bytearray(_SCRATCH)
        self._pending = 0  # bytes of the scratch buffer not yet consumed
        self._frame: bytearray | None = None  # a large frame being filled in place
        self._filled = 0
        self._size = 0  # the large frame's announced size

    def get_buffer(self) -> memoryview:
        """Where the next bytes should be read into."""
        if self._frame is not None:
            if self._filled == len(self._frame):  # full but not complete: grow by doubling
                grown = bytearray(min(self._size, 2 * len(self._frame)))
                grown[: self._filled] = self._frame
                self._frame = grown
            return memoryview(self._frame)[self._filled :]
        return memoryview(self._scratch)[self._pending :]

    def buffer_updated(self, n: int) -> list[bytearray]:
        """Account for `n` bytes read into the last buffer; return the frames now complete."""
        if self._frame is not None:
            self._filled += n
            if self._filled < self._size:
                return []
            frame, self._frame = self._frame, None
            return [frame]
        self._pending += n
        return self._drain_scratch()

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

    def _drain_scratch(self) -> list[bytearray]:
        frames: list[bytearray] = []
        pos, end, scratch = 0, self._pending, self._scratch
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(scratch, pos)
            if size < 0:
                raise InvalidFrame(f"negative frame size {size}")
            if size > self.max_frame_bytes:
                raise FrameTooLarge(size, self.max_frame_bytes)
            available = end - pos - 4
            if available >= size:
                frames.append(scratch[pos + 4 : pos + 4 + size])
                pos += 4 + size
                continue
            if 4 + size > _SCRATCH:
                # Too big for the scratch buffer: give it its own, filled in place from now on.
                first = size if self.trusted else min(size, max(_FIRST_CHUNK, available))
                self._frame = bytearray(first)
                self._frame[:available] = scratch[pos + 4 : end]
                self._filled = available
                self._size = size
                pos = end
            break
        remaining = end - pos
        if remaining and pos:
            scratch[:remaining] = scratch[pos:end]
        self._pending = remaining
        return frames


def frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload
