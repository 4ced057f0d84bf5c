"""Size-prefixed framing, sans I/O.

A Kafka frame is an int32 length followed by that many bytes. `FrameDecoder` is fed whatever
the transport read and yields complete frames. It is shaped for asyncio's BufferedProtocol:
reads land in one buffer per thread and small frames are cut out of it; a large frame gets
buffers of its own that the transport fills directly, so a 1 MB produce request is copied once,
not per chunk.

What a client costs is what it has sent, never what it announced. Nothing is allocated before
bytes arrive: a connection keeps the start of an unfinished small frame as exactly the bytes
that came (2,000 idle connections hold none). A large frame (over 64 KiB) is received only once
admitted (`admit`): the server admits it from the pool all connections' large requests share,
and until then the decoder keeps just the bytes that arrived with its size (2,000 connections
that each announced a large frame and sent 14 bytes hold 14 bytes each, not 1 MiB each).
Once admitted, it is read in place into pieces allocated as its bytes come, each at most as
large as what has arrived before it (so at most twice what was sent, from 64 KiB up to 1 MiB),
and joined once complete: a client that announces 100 MB and trickles it holds about what it
has sent. (Pieces are heap buffers, which the allocator reuses; a memory map per frame costs a
page fault per 4 KiB, twice the CPU per GB produced.) A trusted peer's frame is one buffer.
"""

from __future__ import annotations

import struct
import threading

_SIZE = struct.Struct(">i")
_SCRATCH = 65536  # reads land in a buffer this size; frames beyond it are "large"
_PIECE = 1 << 20  # the largest piece of a large frame
_landing = threading.local()  # .view: this thread's landing buffer
Frame = bytearray


def _new_landing_buffer() -> memoryview:
    view = _landing.view = memoryview(bytearray(_SCRATCH))
    return view


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
        frame needs no admission and its whole buffer is taken at once."""
        self.max_frame_bytes = max_frame_bytes
        self.trusted = trusted
        self._partial = bytearray()  # the start of an unfinished small frame, as it arrived
        # The last buffer handed out, when it was this thread's landing buffer (None: the
        # large frame's piece): kept so that buffer_updated need not look it up again.
        self._landed: memoryview | None = None
        # The size of a large frame announced and not yet admitted (0: none). An attribute,
        # not a property: the server asks after every read.
        self.awaiting_admission = 0
        # The large frame being received:
        self._size = 0  # its announced size (0: none)
        self._admitted = False
        self._head = bytearray()  # its bytes that arrived before it was admitted
        self._pieces: list[bytearray] = []  # its full pieces, once admitted
        self._frame: bytearray | None = None  # the piece being filled
        self._filled = 0  # bytes in `_frame`
        self._received = 0  # bytes of the frame received so far

    @property
    def large_frame_size(self) -> int:
        """The announced size of the large frame being received (0 when none is)."""
        return self._size

    def admit(self) -> list[Frame]:
        """Let the announced large frame take memory: its first piece is made now. Returns the
        frames that bytes which arrived before complete (usually none)."""
        if not self.awaiting_admission:
            return []
        self._admitted, self.awaiting_admission = True, 0
        first = self._size if self.trusted else min(self._size, max(_SCRATCH, len(self._head)))
        self._frame, self._filled = bytearray(first), 0
        head, self._head = self._head, bytearray()
        return self._absorb(memoryview(head)) if head else []

    def get_buffer(self) -> memoryview:
        """Where the next bytes should be read into. Fill it and call `buffer_updated` before
        asking any decoder on this thread for a buffer again."""
        if self._frame is not None:
            self._landed = None
            if self._filled == len(self._frame):  # this piece is full: start the next
                self._next_piece()
            return memoryview(self._frame)[self._filled :]
        try:
            view = _landing.view
        except AttributeError:
            view = _new_landing_buffer()
        self._landed = view
        return view

    def buffer_updated(self, n: int) -> list[Frame]:
        """Account for `n` bytes read into the last buffer; return the frames now complete."""
        landed = self._landed
        if landed is None:  # read in place into the large frame
            self._filled += n
            self._received += n
            return [self._finish()] if self._received == self._size else []
        self._landed = None
        return self._absorb(landed[:n])

    def feed(self, data: bytes) -> list[Frame]:
        """Convenience for callers holding plain bytes (tests, blocking clients): the bytes
        are in memory already, so a large frame is admitted at once."""
        frames: list[Frame] = []
        view = memoryview(data)
        while view:
            buf = self.get_buffer()
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            frames.extend(self.buffer_updated(n))
            frames.extend(self.admit())
        return frames

    def _absorb(self, data: memoryview) -> list[Frame]:
        """Take bytes read into a transient buffer: complete frames are returned, the rest is
        kept (copied) as the start of the next one."""
        frames: list[Frame] = []
        while data:
            if self._size:
                if not self._admitted:
                    if not self.trusted:
                        self._head += data  # reading stops until admission: this is bounded
                        break
                    self.admit()
                data = data[self._copy_into_frame(data, frames) :]
                continue
            if self._partial:
                data = memoryview(self._partial + data)
                self._partial = bytearray()
            pos = self._cut(data, frames)
            data = data[pos:]
            if data and not self._size:
                self._partial = bytearray(data)  # less than one small frame
                break
        return frames

    def _cut(self, buf: memoryview, frames: list[Frame]) -> int:
        """Append the complete frames at the start of `buf`; return where the rest starts. A
        large frame's size is consumed and its reception begins."""
        pos, end = 0, len(buf)
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0:
                raise InvalidFrame(f"negative frame size {size}")
            if size > self.max_frame_bytes:
                raise FrameTooLarge(size, self.max_frame_bytes)
            if end - pos - 4 >= size:
                frames.append(bytearray(buf[pos + 4 : pos + 4 + size]))
                pos += 4 + size
                continue
            if 4 + size > _SCRATCH:
                self._size = self.awaiting_admission = size
                pos += 4
            break
        return pos

    def _copy_into_frame(self, data: memoryview, frames: list[Frame]) -> int:
        """Copy the large frame's bytes from `data` into its pieces; returns how many it took."""
        taken = 0
        while taken < len(data) and self._received < self._size:
            if self._filled == len(self._frame):
                self._next_piece()
            n = min(len(self._frame) - self._filled, len(data) - taken)
            self._frame[self._filled : self._filled + n] = data[taken : taken + n]
            self._filled += n
            self._received += n
            taken += n
        if self._received == self._size:
            frames.append(self._finish())
        return taken

    def _next_piece(self) -> None:
        """The next piece: no larger than what has arrived so far, nor than _PIECE."""
        self._pieces.append(self._frame)
        self._frame = bytearray(min(_PIECE, self._size - self._received, max(_SCRATCH, self._received)))
        self._filled = 0

    def _finish(self) -> Frame:
        last, pieces = self._frame, self._pieces
        self._frame, self._pieces = None, []
        self._size, self._admitted, self._filled, self._received = 0, False, 0, 0
        return bytearray().join([*pieces, last]) if pieces else last


def frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload
