"""SocketServer: listeners, connections, and in-order request processing per connection.

Like Kafka's processors, a connection handles one request at a time and answers in order:
frames are read as they arrive (BufferedProtocol, no per-chunk copies), queued, and a worker
task per connection parses, dispatches to the request handler it was given (the broker's KafkaApis) and writes the response. Fetch responses
send record bytes straight from segment files with sendfile where the event loop can.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import struct
import time
from collections import Counter, deque
from collections.abc import Callable
from functools import partial
from typing import Any

from strom.log.open_files import OPEN_FILES
from strom.metrics.stats import (
    CURRENT_REQUEST,
    LoopIdleSampler,
    RequestMetrics,
    RequestTimer,
    api_name,
    local_time,
)
from strom.network.quotas import ClientQuotas, ConnectionRates
from strom.network.request import (
    API_VERSIONS,
    CloseConnection,
    RawResponse,
    RequestContext,
    RequestHandler,
)
from strom.protocol import messages
from strom.protocol.fetch import fetch_replica_id
from strom.protocol.frames import FrameDecoder, FrameTooLarge, InvalidFrame
from strom.security.sasl import (
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    AuthenticationFailed,
    GuessLimit,
    ListenerSasl,
    SaslAuthenticator,
    SaslProtocolError,
    ScramCredential,
    listener_sasl,
    set_salt_secret,
)
from strom.security.tls import ANONYMOUS, principal, server_context

log = logging.getLogger(__name__)
# Kafka's kafka.request.logger: one line per request at DEBUG (`--log-level strom.request=DEBUG`).
request_log = logging.getLogger("strom.request")

_PAUSE_AT = 64  # queued requests on one connection before we stop reading from it
_SIZE_PREFIX = 4
_COPY_CHUNK = 64 * 1024  # copied when the socket is full, to learn when it drains
_TLS_CHUNK = 256 * 1024  # what a TLS connection encrypts per write of a file region
# A client that sends requests but does not read the answers gets no more answers once this
# much of them waits unsent: its requests stay queued (and reading stops at _PAUSE_AT).
_MAX_UNSENT = 4 << 20
# Answered while the broker starts: the controller's requests (it cannot start without them)
# and ApiVersions; everything else waits until the broker is running.
# Requests above this size are decoded, and their answers encoded, in a worker thread: a
# Metadata request naming a million topics takes seconds of codec work, which on the event
# loop would stall every other client (the loop still gets the GIL every switch interval).
# Produce is exempt: its records stay opaque bytes, cheap to decode at any size.
_LARGE_REQUEST = 1 << 20
# After a request or answer this large, free heap memory goes back to the system a moment
# later (malloc_trim): the allocator would keep a million-topic Metadata's hundreds of MB.
_TRIM_AFTER_BYTES = 16 << 20
_TRIM_DELAY_S = 1.0
_PRODUCE = 0
_BEFORE_READY = frozenset({4, 5, 6, 7, 18, 56})
_FETCH = 1
FD_RESERVE = 256  # descriptors neither log files nor client connections may take


def _libc_malloc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_malloc_trim = _libc_malloc_trim()


class _Region:
    """The file object asyncio's sendfile wants, over a segment fd we must not close."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def seek(self, *_: Any) -> None:
        pass  # the segment is read with pread/sendfile offsets; its file position is unused


class Connection(asyncio.BufferedProtocol):
    def __init__(self, server: SocketServer, listener: str, tls: bool = False) -> None:
        self.server = server
        self.listener = listener
        self.tls = tls  # file regions are copied through the TLS layer: no sendfile
        self.protocol = server.broker.config.protocol_of(listener)
        self.principal = ANONYMOUS
        self.sasl: SaslAuthenticator | None = None  # on SASL listeners
        self.session_expires = 0.0  # monotonic time a SASL session ends (KIP-368), 0: never
        self.waiting_for_guess = False  # a credential waits for its turn (GuessLimit)
        self.decoder = FrameDecoder(server.max_request_bytes)
        # (frame, its pool reservation, when its last byte arrived)
        self.queue: deque[tuple[bytearray, int, float]] = deque()
        self.reserved = 0  # pool bytes held for the large frame being received
        self.waiting_memory = False  # reading stopped until the pool can take that frame
        self.reading_paused = False
        # What the idle worker awaits: a bare future, woken when a frame comes (an Event's
        # wait and set cost a few calls more, once per request).
        self.wakeup: asyncio.Future | None = None
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.paused = False
        self.closing = False
        self.worker: asyncio.Task | None = None
        self.sock_fd = -1
        self.drained = asyncio.Event()
        self.drained.set()
        self.ip = ""
        self.accepted = False
        self.busy = False  # a request is being answered (a long poll is not idleness)
        self.last_active = 0.0
        self.answered = 0.0  # monotonic time the last timed answer was written
        # Answers held while more requests of this connection wait, written together (one
        # syscall for a burst of small requests instead of one each) at the end of this turn
        # of the loop, or before anything that must follow them (a file region, a close).
        self.unsent: list[bytes] = []
        self.flush_scheduled = False

    # --- transport callbacks -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.sock_fd = sock.fileno()
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        # Report any unsent byte, so `drained` tells exactly when the socket took everything.
        # (A TLS transport keeps its default limits: with high=0 it never reports the drain.)
        if not self.tls:
            transport.set_write_buffer_limits(high=0)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if self.tls:  # called once the handshake is done
            self.principal = principal(transport.get_extra_info("peercert"))
        self.ip = peer[0] if peer else "?"
        refusal = self.server.admit(self.ip)
        if refusal is not None:
            self.server.warn_once(f"refused-{refusal}", f"refusing a connection from {self.ip}: {refusal}")
            transport.abort()
            return
        sasl = self.server.sasl.get(self.listener)
        if sasl is not None:
            self.sasl = SaslAuthenticator(sasl)
        self.accepted = True
        self.last_active = asyncio.get_running_loop().time()
        self.server.connections_created[self.listener] += 1
        self.server.connections.add(self)
        self.server.per_ip[self.ip] += 1
        self.worker = asyncio.get_running_loop().create_task(self._work())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = asyncio.get_running_loop().time()
        try:
            frames = self.decoder.buffer_updated(nbytes)
        except (FrameTooLarge, InvalidFrame) as e:
            log.warning("closing connection from %s: %s", self.peer, e)
            self.close()
            return
        self._queue_frames(frames)
        if self.decoder.awaiting_admission:
            self._admit_large_frame()

    def _queue_frames(self, frames: list[bytearray]) -> None:
        if not frames:
            return
        now = time.monotonic()
        # Only a large frame holds a reservation, and it completes before any frame after it.
        reservation, self.reserved = self.reserved, 0
        self.queue.append((frames[0], reservation, now))
        if len(frames) > 1:
            self.queue.extend((f, 0, now) for f in frames[1:])
        self._wake()
        if len(self.queue) >= _PAUSE_AT and not self.paused:
            self.paused = True
            self._update_reading()

    def _wake(self) -> None:
        """Wake the worker if it waits for a frame (or for the connection's end)."""
        waiter, self.wakeup = self.wakeup, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _admit_large_frame(self) -> None:
        """A large frame is announced: it may take memory only once the pool all connections
        share (queued.max.request.bytes, Kafka's MemoryPool) grants its whole size; until then
        the connection is not read and its decoder holds only the bytes that came."""
        while (size := self.decoder.awaiting_admission) and not self.waiting_memory and not self.closing:
            if self.sasl is not None and self.sasl.principal is None and size > self.server.sasl_max_receive:
                # sasl.server.max.receive.size: before authentication a client cannot make the
                # broker hold a large frame.
                log.warning("closing connection from %s: a %d-byte frame before SASL authentication",
                            self.peer, size)
                self.close()
                return
            if not self.server.request_memory.try_acquire(self, size):
                self.waiting_memory = True
                self._update_reading()
                return
            self.reserved = size
            self._queue_frames(self.decoder.admit())

    def memory_granted(self, size: int) -> None:
        if self.closing:
            self.server.request_memory.release(size)
            return
        self.reserved, self.waiting_memory = size, False
        self._queue_frames(self.decoder.admit())
        self._admit_large_frame()
        self._update_reading()

    def _update_reading(self) -> None:
        pause = self.paused or self.waiting_memory
        if pause != self.reading_paused and self.transport is not None and not self.transport.is_closing():
            self.reading_paused = pause
            (self.transport.pause_reading if pause else self.transport.resume_reading)()

    def _release_memory(self) -> None:
        pool = self.server.request_memory
        held = self.reserved + sum(r for _, r, _ in self.queue)
        self.reserved = 0
        self.waiting_memory = False
        pool.forget(self)
        pool.release(held)

    def pause_writing(self) -> None:
        self.drained.clear()

    def resume_writing(self) -> None:
        self.drained.set()

    def eof_received(self) -> bool:
        self.closing = True
        self._wake()
        if self.waiting_for_guess and self.worker is not None:
            # A guess waiting its turn, from a client that left: it takes no turn.
            self.worker.cancel()
        # Keep the write side open until queued requests are answered (TLS cannot half-close).
        return not self.tls

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._release_memory()
        if self.accepted:
            self.accepted = False
            self.server.connections_closed[self.listener] += 1
            self.server.connections.discard(self)
            self.server.per_ip[self.ip] -= 1
            if not self.server.per_ip[self.ip]:
                del self.server.per_ip[self.ip]
            for listener in self.server.connection_listeners:
                try:
                    listener(self.peer)
                except Exception:  # a listener's failure must not stop the others or the close
                    log.exception("after the connection from %s closed", self.peer)
        if self.worker is not None and not self.worker.done():
            self.worker.cancel()

    def close(self) -> None:
        self.closing = True
        self._release_memory()
        self.queue.clear()
        self._wake()
        if self.transport is not None:
            self.flush()
            self.transport.close()

    # --- writing answers ---------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Send an answer: at once if no other request of this connection waits, else with
        the answers to those, in one write at the end of this turn of the loop."""
        if self.queue:
            self.unsent.append(data)
            if not self.flush_scheduled:
                self.flush_scheduled = True
                asyncio.get_running_loop().call_soon(self.flush)
        elif self.unsent:
            self.unsent.append(data)
            self.flush()
        elif self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def flush(self) -> None:
        self.flush_scheduled = False
        if not self.unsent:
            return
        data = b"".join(self.unsent) if len(self.unsent) > 1 else self.unsent[0]
        self.unsent.clear()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # --- request processing ---------------------------------------------------------------
    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                while not self.queue:
                    if self.closing:
                        if self.transport is not None and not self.transport.is_closing():
                            self.flush()
                            self.transport.close()
                        return
                    self.wakeup = loop.create_future()
                    await self.wakeup
                frame, reservation, received = self.queue.popleft()
                if self.paused and len(self.queue) < _PAUSE_AT // 2:
                    self.paused = False
                    self._update_reading()
                self.server.in_flight += 1
                self.busy = True
                try:
                    await self._process(frame, received)
                finally:
                    del frame
                    if reservation:
                        self.server.request_memory.release(reservation)
                    self.server.in_flight -= 1
                    self.busy = False
                    self.last_active = loop.time()
                if self.transport is not None and self.transport.get_write_buffer_size() > _MAX_UNSENT:
                    await self.drained.wait()
        except asyncio.CancelledError:
            pass
        except ConnectionError as e:  # the peer went away mid-response: not the broker's fault
            log.info("connection from %s lost while answering: %s", self.peer, e)
            self.close()
        except Exception as e:
            # One line (the traceback at DEBUG): a request that trips a handler must not let
            # a client write pages of log, and such events are rate-limited.
            self.server.warn_once(f"failed-{type(e).__name__}", f"closing connection from {self.peer}: "
                                  f"request failed with {type(e).__name__}: {str(e)[:200]}")
            log.debug("request from %s failed", self.peer, exc_info=True)
            self.close()

    async def _process(self, frame: bytearray, received: float) -> None:
        server = self.server
        # The clock is read only for what needs it: request metrics, the request log, quotas.
        timed = server.request_metrics is not None or request_log.isEnabledFor(logging.DEBUG)
        metered = timed or bool(server.quotas.entities)
        started = time.monotonic() if metered else 0.0
        if self.sasl is not None and self.sasl.raw_tokens:
            await self._raw_sasl_token(frame)
            return
        offload = len(frame) > _LARGE_REQUEST and frame[:2] != _PRODUCE.to_bytes(2, "big")
        try:
            request = (await asyncio.to_thread(messages.parse_request, frame) if offload
                       else messages.parse_request(frame))
        except messages.UnsupportedRequest as e:
            self._reject_unsupported(frame, str(e))
            return
        except messages.InvalidRequest as e:
            log.warning("closing connection from %s: %s", self.peer, e)
            self.close()
            return
        header = request.header
        if (header.api_key, header.api_version) not in server.supported and not server.supports(header):
            self._reject_unsupported(frame, f"api key {header.api_key} v{header.api_version} is not supported")
            return
        if self.sasl is not None and await self._sasl_gate(header, request.body):
            return
        ctx = RequestContext(header, self.listener, self.peer, self.principal, self.protocol,
                             self.sasl is not None and self.sasl.token_authenticated)
        if header.api_key not in _BEFORE_READY and not self.server.ready.is_set():
            # As Kafka starts processing requests only once started: a client asking a broker
            # that has not heard from the controller yet would be told its topics do not exist.
            await self.server.ready.wait()
        # Kafka reads a connection's next request only after answering the previous one, so
        # its queue time starts then, not while it waited behind that one.
        timer = RequestTimer(max(received, self.answered), started) if timed else None
        CURRENT_REQUEST.set(timer)
        try:
            response = await server.apis.handle(ctx, request.body)
        except CloseConnection as e:
            log.info("closing connection from %s: %s", self.peer, e)
            self.close()
            return
        handled = time.monotonic() if metered else 0.0
        if timer is not None:
            timer.handled = timer.sending = handled
        throttle = 0
        if server.quotas.entities:  # any client quota configured at all
            follower = header.api_key == _FETCH and fetch_replica_id(request.body) >= 0
            throttle = server.quotas.request_throttle_ms(
                _user(self.principal), header.client_id or "", header.api_key, len(frame),
                _response_size(header.api_key, response), handled - started - (timer.remote if timer else 0.0),
                follower)
        if throttle:
            _set_throttle(response, throttle)
            if timer is not None:
                timer.throttle = throttle / 1000
        size = 0
        if response is None or self.transport is None or self.transport.is_closing():
            pass
        elif isinstance(response, RawResponse):
            parts = response.parts
            if len(parts) == 1 and type(parts[0]) is bytes:  # one encoded body (Produce): one write
                head = messages.response_header(header)
                size = _SIZE_PREFIX + len(head) + len(parts[0])
                self.write(b"".join(((size - _SIZE_PREFIX).to_bytes(_SIZE_PREFIX, "big"), head, parts[0])))
            else:
                size = await self._send_parts(messages.response_header(header), parts)
        else:
            encoded = (await asyncio.to_thread(messages.encode_response, header, response) if offload
                       else messages.encode_response(header, response))
            size = len(encoded)
            if timer is not None:
                timer.sending = time.monotonic()
            self.write(encoded)
        if timer is not None:
            self.answered = time.monotonic()
            server.request_done(self, header, len(frame), size, timer, self.answered)
        if len(frame) + size > _TRIM_AFTER_BYTES:
            self.server.trim_memory_soon()
        if throttle:
            # KIP-219: the answer goes out at once, saying how long; the connection is read no
            # further meanwhile (its next request waits here), as Kafka mutes the channel.
            await asyncio.sleep(throttle / 1000)
            if timer is not None:  # the next request's queue time starts once it is unmuted
                self.answered = time.monotonic()

    # --- SASL (Kafka's SaslServerAuthenticator) ------------------------------------------------

    async def _sasl_gate(self, header: Any, body: Any) -> bool:
        """Authentication in front of the handlers: True if the request was answered (or the
        connection closed) here. Before authentication only ApiVersions, SaslHandshake and
        SaslAuthenticate pass; an expired session (KIP-368) closes the connection."""
        key = header.api_key
        if key == SASL_HANDSHAKE:
            self._answer(header, self.sasl.handshake(body.mechanism, header.api_version))
            return True
        if key == SASL_AUTHENTICATE:
            guess = await self._guess_turn(body.auth_bytes)
            response = self.sasl.authenticate(body.auth_bytes)
            self.server.guesses.done(guess, failed=bool(response["error_code"]))
            if response["error_code"]:
                await self._authentication_failed(response["error_message"])
                self._answer(header, response)
                self.close()
                return True
            if self.sasl.mechanism.complete:
                self._authenticated()
            self._answer(header, response)
            return True
        if self.sasl.principal is None:
            if key == API_VERSIONS:
                return False
            log.warning("closing connection from %s: %s before SASL authentication", self.peer, api_name(key))
            self.close()
            return True
        if self.session_expires and time.monotonic() > self.session_expires:
            log.info("closing connection from %s (%s): its SASL session expired without re-authentication",
                     self.peer, self.principal)
            self.close()
            return True
        return False

    async def _raw_sasl_token(self, frame: bytearray) -> None:
        """After a v0 SaslHandshake the exchange is bare tokens, each in a size-prefixed frame."""
        token = bytes(frame)
        guess = await self._guess_turn(token)
        try:
            reply = self.sasl.step(token)
        except (AuthenticationFailed, SaslProtocolError) as e:
            self.server.guesses.done(guess, failed=True)
            await self._authentication_failed(str(e))
            self.close()
            return
        self.server.guesses.done(guess, failed=False)
        if self.sasl.principal is not None and not self.sasl.raw_tokens:
            self._authenticated()
        self.write(len(reply).to_bytes(_SIZE_PREFIX, "big") + reply)

    def _authenticated(self) -> None:
        self.principal = self.sasl.principal
        lifetime = self.sasl.session_lifetime_ms()
        self.session_expires = time.monotonic() + lifetime / 1000 if lifetime else 0.0
        log.debug("%s authenticated as %s with %s", self.peer, self.principal, self.sasl.mechanism_name)

    async def _guess_turn(self, token: bytes) -> bytes | None:
        """If `token` guesses a user's secret, wait for that guess's turn (security/sasl.py
        GuessLimit). The brokers' own user on the inter-broker listener never waits."""
        user = self.sasl.guess_of(token)
        if user is None or (self.listener, user) == self.server.inter_broker_user:
            return None
        self.waiting_for_guess = True
        try:
            return await self.server.guesses.turn(user, self.ip)
        finally:
            self.waiting_for_guess = False

    async def _authentication_failed(self, why: str | None) -> None:
        """One line, then connection.failed.authentication.delay.ms before the answer, as Kafka
        slows down password guessing."""
        self.server.warn_once(f"auth-failed-{self.ip}", f"failed authentication with {self.peer} "
                              f"({self.sasl.mechanism_name}): {why}", every_s=1.0)
        await asyncio.sleep(self.server.broker.config["connection.failed.authentication.delay.ms"] / 1000)

    def _answer(self, header: Any, response: dict) -> None:
        self.write(messages.encode_response(header, response))

    def _reject_unsupported(self, frame: bytearray, reason: str) -> None:
        """Kafka answers ApiVersions of an unknown version with UNSUPPORTED_VERSION at v0 and
        closes the connection for any other api key or version it cannot parse."""
        try:
            header, _ = messages.parse_header(frame)
        except messages.InvalidRequest:
            header = None
        if header is not None and header.api_key == API_VERSIONS:
            log.info("ApiVersions v%d from %s is not supported; answering with v0",
                     header.api_version, self.peer)
            self.write(messages.encode_response(header, self.server.apis.unsupported_version_response(), version=0))
            return
        log.warning("closing connection from %s: %s", self.peer, reason)
        self.close()

    async def _send_parts(self, response_header: bytes, parts: list[Any]) -> int:
        """Write a response of bytes and file regions; returns its size."""
        size = len(response_header) + sum(_part_size(p) for p in parts)
        pending = [size.to_bytes(_SIZE_PREFIX, "big"), response_header]
        for part in parts:
            if isinstance(part, bytes | bytearray | memoryview):
                pending.append(part)
            elif part.data is not None:
                # A small region was read with the fetch: one write beats the sendfile machinery.
                pending.append(part.data)
            else:
                self.write(b"".join(pending))
                pending = []
                self.flush()  # the region's bytes go after every answer before them
                await self.server.send_region(self, part)
        if pending:
            self.write(b"".join(pending))
        return size + _SIZE_PREFIX

    async def sendfile_when_idle(self, region: Any) -> None:
        """Zero copy without the loop's help (uvloop has no sendfile): `os.sendfile` on the
        socket while the transport has nothing queued, so bytes stay in order; when the socket
        is full, queue one small copied chunk with the transport and wait until it drains.
        Under TLS the bytes must pass through the TLS layer: copied chunks only, larger ones."""
        pos, end = region.position, region.position + region.size
        chunk_size = _TLS_CHUNK if self.tls else _COPY_CHUNK
        while pos < end:
            if self.transport.is_closing():
                return
            if not self.tls and self.transport.get_write_buffer_size() == 0:
                try:
                    sent = os.sendfile(self.sock_fd, region.fd, pos, end - pos)
                except BlockingIOError:
                    sent = 0
                if sent:
                    pos += sent
                    continue
            chunk = os.pread(region.fd, min(chunk_size, end - pos), pos)
            if not chunk:
                raise OSError(f"segment region ends early at byte {pos}")
            self.transport.write(chunk)
            pos += len(chunk)
            if not self.tls or self.transport.get_write_buffer_size() > _TLS_CHUNK:
                await self.drained.wait()


def _user(principal: str) -> str:
    """The user a quota is looked up for: the principal's name (Kafka: "ANONYMOUS" unauthenticated)."""
    return principal.partition(":")[2] or principal


def _response_size(api_key: int, response: Any) -> int:
    if api_key == _FETCH and isinstance(response, RawResponse):
        return sum(_part_size(p) for p in response.parts)
    return 0  # only Fetch is metered by its size


def _part_size(part: Any) -> int:
    """A RawResponse part: bytes, or a file region."""
    return len(part) if isinstance(part, bytes | bytearray | memoryview) else part.size


def _set_throttle(response: Any, throttle_ms: int) -> None:
    """Tell the client how long it is held back: in a response's throttle_time_ms, which a
    RawResponse (Fetch) carries as the first field of its body."""
    if isinstance(response, RawResponse):
        if response.throttle_at is not None:
            head, at = bytearray(response.parts[0]), response.throttle_at
            head[at : at + 4] = struct.pack(">i", throttle_ms)
            response.parts[0] = bytes(head)
    elif isinstance(response, dict) and "throttle_time_ms" in response:
        response["throttle_time_ms"] = max(response["throttle_time_ms"] or 0, throttle_ms)


class RequestMemory:
    """queued.max.request.bytes: the bytes all connections' large requests may hold at once,
    reserved whole when a frame's size is read; connections wait in turn (reading paused)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # <= 0: unbounded, as Kafka's -1
        self.used = 0
        self.waiting: deque[tuple[Connection, int]] = deque()

    def try_acquire(self, conn: Connection, size: int) -> bool:
        if self.capacity <= 0:
            return True
        if not self.waiting and self.used + size <= self.capacity:
            self.used += size
            return True
        self.waiting.append((conn, size))
        return False

    def release(self, size: int) -> None:
        if self.capacity <= 0 or not size:
            return
        self.used -= size
        self._grant()

    def forget(self, conn: Connection) -> None:
        if any(c is conn for c, _ in self.waiting):
            self.waiting = deque((c, n) for c, n in self.waiting if c is not conn)
            self._grant()

    def _grant(self) -> None:
        while self.waiting and self.used + self.waiting[0][1] <= self.capacity:
            conn, wanted = self.waiting.popleft()
            self.used += wanted
            conn.memory_granted(wanted)


class SocketServer:
    def __init__(self, broker: Any, apis: RequestHandler, max_request_bytes: int,
                 queued_max_request_bytes: int = -1) -> None:
        self.broker = broker
        self.apis = apis  # where requests go: the broker's KafkaApis
        # (api key, version) pairs the handlers serve, as asked so far: each request looks in
        # this set rather than asking the handlers (bounded by their table: refusals are not kept).
        self.supported: set[tuple[int, int]] = set()
        self.max_request_bytes = max_request_bytes
        self.request_memory = RequestMemory(queued_max_request_bytes)
        self.servers: list[asyncio.base_events.Server] = []
        self.connections: set[Connection] = set()
        self.in_flight = 0
        self.bound: dict[str, tuple[str, int]] = {}
        self._native_sendfile = True
        self.per_ip: Counter[str] = Counter()
        self.ready = asyncio.Event()  # set once the broker runs
        self._warned: dict[str, float] = {}
        self._idle_task: asyncio.Task | None = None
        self.connections_created: Counter[str] = Counter()  # per listener
        # Called with a client's address ("host:port", RequestContext.client) when its connection
        # closes: what the broker keeps per connection (share sessions) goes with it.
        self.connection_listeners: list[Callable[[str], None]] = []
        self.connections_closed: Counter[str] = Counter()
        # Set when the metrics endpoint is on: request times and the loop's idle ratio.
        self.request_metrics: RequestMetrics | None = None
        self.loop_idle: LoopIdleSampler | None = None
        self.sasl: dict[str, ListenerSasl] = {}  # SASL listeners' setups, by listener name
        self.quotas = ClientQuotas({})  # given the cluster's quota configs at start()
        self.connection_rates = ConnectionRates({})
        self.sasl_max_receive = 524288
        self._trim_pending = False
        self._trim_task: asyncio.Task | None = None
        self.guesses = GuessLimit(0, 1.0)  # configured at start()
        self.inter_broker_user: tuple[str, str] | None = None  # (listener, user) of brokers' own SASL
        # Connections the open-file limit leaves room for after the log's share (set at start-up
        # by budget_file_descriptors): clients cannot take the descriptors segment rolls need.
        self.max_connections_by_fds = 2**31 - 1

    def supports(self, header: Any) -> bool:
        """Whether a handler serves the request's api key and version (kept once it does)."""
        if not self.apis.supports(header.api_key, header.api_version):
            return False
        self.supported.add((header.api_key, header.api_version))
        return True

    def budget_file_descriptors(self) -> None:
        """Raise the open-file limit to its hard maximum (as the JVM does for Kafka) and split it:
        half for log files (a bounded cache: partitions are not capped by the limit), most of
        the rest for client connections, and a reserve for everything else (checkpoints, the
        cleaner, the metadata store), so clients can never starve the log of descriptors."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = max(soft, 1 << 20)
        if soft < hard:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
                soft = hard
            except (ValueError, OSError) as e:
                log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, e)
        OPEN_FILES.capacity = max(64, soft // 2)
        self.max_connections_by_fds = max(16, soft - OPEN_FILES.capacity - FD_RESERVE)
        log.info("open-file limit %d: log files keep at most %d open, clients at most %d connections",
                 soft, OPEN_FILES.capacity, self.max_connections_by_fds)

    # --- connection quotas (max.connections, max.connections.per.ip, connections.max.idle.ms)

    def admit(self, ip: str) -> str | None:
        """None if a new connection from `ip` may stay, else why not (Kafka's limits)."""
        config = self.broker.config
        if len(self.connections) >= config["max.connections"]:
            return f"max.connections={config['max.connections']} reached"
        if len(self.connections) >= self.max_connections_by_fds:
            return (f"{self.max_connections_by_fds} connections reached, what the open-file limit "
                    "leaves after the log's share")
        limit = config["max.connections.per.ip"]
        for pair in filter(None, (p.strip() for p in config["max.connections.per.ip.overrides"].split(","))):
            host, _, count = pair.rpartition(":")
            if host == ip and count.isdigit():
                limit = int(count)
        if self.per_ip[ip] >= limit:
            return f"max.connections.per.ip={limit} reached"
        return self.connection_rates.admit(ip, config["max.connection.creation.rate"])

    def enable_metrics(self) -> None:
        self.request_metrics = RequestMetrics()
        self.loop_idle = LoopIdleSampler()
        self.loop_idle.start()

    def request_done(self, conn: Connection, header: Any, request_size: int, response_size: int,
                     t: RequestTimer, done: float) -> None:
        """Record a request's times (Kafka's RequestMetrics) and, on demand, log it (Kafka's
        request logger): queue, local, remote and send times in one line."""
        if self.request_metrics is not None:
            self.request_metrics.record(header.api_key, header.api_version, t, done)
        if request_log.isEnabledFor(logging.DEBUG):
            request_log.debug(
                "%s v%d correlation %d from client %r at %s (%s, %s): %d bytes in, %d bytes out; "
                "total %.3f ms = queue %.3f + local %.3f + remote %.3f + response queue %.3f + send %.3f",
                api_name(header.api_key), header.api_version, header.correlation_id, header.client_id,
                conn.peer, conn.listener, conn.principal, request_size, response_size, (done - t.received) * 1000,
                (t.started - t.received) * 1000, local_time(t) * 1000, t.remote * 1000,
                (t.sending - t.handled) * 1000, (done - t.sending) * 1000)

    def trim_memory_soon(self) -> None:
        """Give free heap memory back to the system once the large request just answered is
        gone (one trim however many such requests came meanwhile)."""
        if self._trim_pending or _malloc_trim is None:
            return
        self._trim_pending = True

        async def trim() -> None:
            await asyncio.sleep(_TRIM_DELAY_S)
            self._trim_pending = False
            await asyncio.to_thread(_malloc_trim, 0)

        self._trim_task = asyncio.get_running_loop().create_task(trim())

    def warn_once(self, key: str, message: str, every_s: float = 10.0) -> None:
        """One line per kind of event per `every_s`: a flood must not flood the log."""
        now = asyncio.get_running_loop().time()
        if now - self._warned.get(key, -every_s) >= every_s:
            self._warned[key] = now
            log.warning(message)

    async def _close_idle(self) -> None:
        while True:
            idle_ms = self.broker.config["connections.max.idle.ms"]
            await asyncio.sleep(max(0.1, min(30.0, idle_ms / 4000)) if idle_ms > 0 else 30.0)
            if idle_ms <= 0:
                continue
            now = asyncio.get_running_loop().time()
            for conn in list(self.connections):
                if not conn.queue and not conn.busy and now - conn.last_active > idle_ms / 1000:
                    log.info("closing connection from %s: idle for more than connections.max.idle.ms=%d",
                             conn.peer, idle_ms)
                    conn.close()

    async def start(self, listeners: list[Any], send_buffer: int, receive_buffer: int) -> None:
        """Listen on every listener: SSL and SASL_SSL ones speak TLS, SASL_* ones authenticate."""
        loop = asyncio.get_running_loop()
        config = self.broker.config
        self.sasl_max_receive = config["sasl.server.max.receive.size"]
        self.guesses = GuessLimit(config["sasl.server.failed.authentication.limit"],
                                  config["sasl.server.failed.authentication.window.ms"] / 1000)
        set_salt_secret(config["delegation.token.secret.key"])
        security = self.broker.inter_broker_security
        if security is not None and security.sasl_mechanism:
            self.inter_broker_user = (config.inter_broker_listener, security.username)
        windows = (config["quota.window.size.seconds"], config["quota.window.num"])
        self.quotas = ClientQuotas(self.broker.config_repository.clients, *windows)
        self.connection_rates = ConnectionRates(self.broker.config_repository.clients, *windows)
        for listener in listeners:
            if config.protocol_of(listener.name).startswith("SASL_"):
                self.sasl[listener.name] = listener_sasl(
                    partial(config.listener_setting, listener.name), listener.name, self._scram_credential,
                    self._token_credential)
        for listener in listeners:
            context = None
            if config.protocol_of(listener.name) in ("SSL", "SASL_SSL"):
                context = server_context(partial(config.listener_setting, listener.name), listener.name)
            server = await loop.create_server(
                lambda name=listener.name, secure=context is not None: Connection(self, name, secure),
                host=listener.host or None, port=listener.port, reuse_address=True, backlog=1024,
                ssl=context, ssl_handshake_timeout=10 if context is not None else None,
            )
            for sock in server.sockets:
                if send_buffer > 0:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
                if receive_buffer > 0:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            host, port = server.sockets[0].getsockname()[:2]
            self.bound[listener.name] = (host, port)
            self.servers.append(server)
        self._idle_task = loop.create_task(self._close_idle(), name="connections-max-idle")

    def _token_credential(self, mechanism: str, token_id: str) -> tuple[ScramCredential, str, int] | None:
        return self.broker.delegation_tokens.credential(mechanism, token_id)

    def _scram_credential(self, mechanism: str, user: str) -> ScramCredential | None:
        text = self.broker.config_repository.user(user).get(mechanism)
        return ScramCredential.decode(text) if text else None

    async def send_region(self, conn: Connection, region: Any) -> None:
        """Send a file region with zero copy: the loop's sendfile where it has one (asyncio),
        else `os.sendfile` between the transport's own writes (uvloop)."""
        transport = conn.transport
        if transport.is_closing():
            return  # the peer is gone; loop.sendfile would raise "Transport is closing"
        if self._native_sendfile and not conn.tls:
            loop = asyncio.get_running_loop()
            try:
                await loop.sendfile(transport, _Region(region.fd), region.position, region.size,
                                    fallback=False)
                return
            except NotImplementedError:  # the loop has no sendfile at all (uvloop)
                self._native_sendfile = False
                log.info("event loop has no native sendfile; sending file regions directly")
            except asyncio.SendfileNotAvailableError:
                # asyncio raises this when os.sendfile fails before the first byte, e.g. because
                # the peer reset: copy this one region, keep zero copy for everyone else.
                if transport.is_closing():
                    return
                transport.write(os.pread(region.fd, region.size, region.position))
                return
        await conn.sendfile_when_idle(region)

    async def stop_accepting(self) -> None:
        for server in self.servers:
            server.close()
        if self._idle_task is not None:
            self._idle_task.cancel()
        if self.loop_idle is not None:
            self.loop_idle.stop()

    async def drain(self, timeout: float) -> None:
        """Let in-flight requests finish (their responses written), then close connections."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self.in_flight and loop.time() < end:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.close()
