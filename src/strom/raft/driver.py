"""An asyncio driver around RaftCore: a monotonic millisecond clock and a timer, a `send`
callable for outgoing requests, a FileMetadataLog for the disk effects (fsyncs and file writes
run in a worker thread), and a listener for what the state machine must hear.

Effects run in the order the core emitted them, one at a time, so the quorum-state is on disk
before a vote leaves and a snapshot is durable before the log behind it is deleted. What the
state machine must hear (commits, snapshots to load, leader changes) goes to the listener in
that same order but on a queue of its own: applying a commit of 100,000 records takes seconds,
and the fetches and answers that keep the quorum alive must not wait behind it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from strom.raft import effects as fx
from strom.raft.config import QuorumConfig
from strom.raft.core import DESCRIBE_QUORUM, NotLeader, RaftCore
from strom.raft.file_log import DEFAULT_SEGMENT_BYTES, FileMetadataLog
from strom.raft.state import Role

log = logging.getLogger(__name__)

# A timer of STALL_CHECK_S that fires more than STALL_S past its time means the process was held.
STALL_CHECK_S = 0.05
STALL_S = 0.1

SendFn = Callable[[int, int, int, dict[str, Any]], Awaitable[Any]]
# Called with Committed, LoadSnapshot, LeaderChanged and SnapshotDue, in order; may be a
# coroutine function (a big snapshot is loaded off the loop): the next effect waits for it.
Listener = Callable[[fx.Effect], Awaitable[None] | None]


def to_fields(body: Any) -> dict[str, Any]:
    """A decoded codec object as the plain field dicts the core reads."""
    return body if isinstance(body, dict) else body.to_dict(json=False)


class RaftDriver:
    def __init__(self, config: QuorumConfig, directory: Path, send: SendFn,
                 listener: Listener | None = None, rng: random.Random | None = None,
                 directory_id: uuid.UUID | None = None, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.config = config
        self.directory_id = directory_id
        self.file = FileMetadataLog(directory, segment_bytes)
        self._send_fn = send
        self.listener = listener
        self._rng = rng or random.Random()
        self.core: RaftCore | None = None
        self._queue: asyncio.Queue[list[fx.Effect] | None] = asyncio.Queue()
        self._heard: asyncio.Queue[fx.Effect | None] = asyncio.Queue()  # for the listener, in order
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._pending: set[asyncio.Task] = set()
        self._commit_waiters: list[tuple[int, asyncio.Future]] = []
        self._flush_lock = asyncio.Lock()
        self.high_watermark = 0
        self._closed = False
        self._held_ms = 0  # how long the timer found this process held, in all

    def now(self) -> int:
        """The core's clock (monotonic ms, for its timers, less the time this process was seen
        held); the core also learns the wall clock's offset from it, to stamp batches with
        wall-clock ms."""
        now = int(time.monotonic() * 1000) - self._held_ms
        if self.core is not None:
            self.core.wall_clock_offset_ms = int(time.time() * 1000) - now
        return now

    # --- life cycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        loaded = await asyncio.to_thread(self.file.load)
        self.core = RaftCore(self.config, rng=self._rng, election=loaded.election,
                             log_batches=loaded.batches, snapshot=loaded.snapshot, directory_id=self.directory_id)
        self._tasks = [asyncio.create_task(self._run_effects()), asyncio.create_task(self._run_timer()),
                       asyncio.create_task(self._run_listener()), asyncio.create_task(self._watch_for_stalls())]
        self._feed(self.core.start(self.now()))

    async def close(self, resign: bool = True) -> None:
        """Stop; a leader resigns first (EndQuorumEpoch) so that the others elect at once."""
        if self.core is not None and resign and self.core.role is Role.LEADER:
            self._feed(self.core.resign(self.now()))
            await self._drain()
            if self._pending:  # let EndQuorumEpoch reach the voters: they elect without waiting
                await asyncio.wait(list(self._pending), timeout=self.config.request_timeout_ms / 1000)
        self._closed = True
        self._wake.set()
        await self._queue.put(None)
        await self._heard.put(None)
        for t in self._tasks:
            t.cancel()
        for t in list(self._pending):
            t.cancel()
        await asyncio.gather(*self._tasks, *self._pending, return_exceptions=True)
        await asyncio.to_thread(self.file.close)
        for _, fut in self._commit_waiters:
            if not fut.done():
                fut.set_exception(ConnectionError("raft driver closed"))

    async def _drain(self) -> None:
        done = asyncio.get_running_loop().create_future()
        self._feed([_Barrier(done)])  # type: ignore[list-item]
        await done

    # --- inputs ---------------------------------------------------------------------------------

    async def handle_request(self, api_key: int, version: int, body: Any, src: int = -1) -> dict[str, Any]:
        """Answer a Raft request (the caller's server decoded it); may wait (fetch long-poll)."""
        if self._closed:
            raise ConnectionError("raft driver closed")
        fut = asyncio.get_running_loop().create_future()
        self._feed(self.core.handle_request(fut, src, api_key, version, to_fields(body), self.now()))
        response = await fut
        if api_key == DESCRIBE_QUORUM:
            _wall_clock_times(response, time.time() * 1000 - self.now())
        return response

    async def append(self, values: list[bytes], wait: bool = True) -> int:
        """Leader only: append `values` as one batch and return the offset of its last record,
        once committed (NotLeader if leadership is lost first: the batch may or may not be)."""
        last, effects = self.core.append(values, self.now())
        if not wait:
            self._feed(effects)
            return last
        fut = asyncio.get_running_loop().create_future()
        self._commit_waiters.append((last, fut))
        self._feed(effects)
        return await fut

    async def snapshot(self, end_offset: int, values: Callable[[], list[bytes]]) -> bool:
        """Snapshot the state machine as of `end_offset`: `values()` (the state's records) and
        the snapshot's bytes are made in a worker thread, so a large state does not stop the
        loop. False when there can be no snapshot at that offset now."""
        try:
            plan = self.core.snapshot_plan(end_offset)
        except ValueError as e:
            log.debug("no snapshot at %d: %s", end_offset, e)
            self.core.snapshot_failed()
            return False
        now = int(time.time() * 1000)  # the snapshot header's last contained timestamp: wall clock
        data = await asyncio.to_thread(lambda: plan.build(values(), now))
        self._feed(self.core.install_snapshot(plan.snapshot_id, data, self.now()))
        return True

    def _feed(self, effects: list[fx.Effect]) -> None:
        if effects:
            self._queue.put_nowait(effects)
        self._wake.set()

    # --- effects --------------------------------------------------------------------------------

    async def _run_effects(self) -> None:
        while (batch := await self._queue.get()) is not None:
            for effect in batch:
                try:
                    await self._apply(effect)
                except Exception:  # a disk that fails cannot be trusted: stop like Kafka does
                    log.exception("raft effect %s failed; stopping the quorum driver", type(effect).__name__)
                    raise

    async def _apply(self, e: fx.Effect) -> None:
        if isinstance(e, fx.Send):
            self._spawn(self._send(e))
        elif isinstance(e, fx.Respond):
            if not e.ref.done():
                e.ref.set_result(e.body)
        elif isinstance(e, fx.PersistElectionState):
            await asyncio.to_thread(self.file.write_election, e.text)
        elif isinstance(e, fx.AppendLog):
            self.file.append(e.batch)  # a write into the page cache; the fsync is FlushLog
        elif isinstance(e, fx.FlushLog):
            self._spawn(self._flush(e))
        elif isinstance(e, fx.TruncateLog):
            async with self._flush_lock:
                await asyncio.to_thread(self.file.truncate, e.end_offset)
        elif isinstance(e, fx.WriteSnapshot):
            await asyncio.to_thread(self.file.write_snapshot, e.snapshot_id, e.data)
        elif isinstance(e, fx.DeleteLogPrefix):
            await asyncio.to_thread(self.file.delete_prefix, e.start_offset, e.reset)
        elif isinstance(e, _Barrier):
            e.done.set_result(None)
        else:
            self._heard.put_nowait(e)

    async def _run_listener(self) -> None:
        while (e := await self._heard.get()) is not None:
            if self.listener is not None:
                try:
                    applied = self.listener(e)
                    if inspect.isawaitable(applied):
                        await applied
                except Exception:  # the state machine cannot follow the log: stop like Kafka does
                    log.exception("applying raft effect %s failed; stopping the quorum driver", type(e).__name__)
                    self._queue.put_nowait(None)  # and this node goes silent, for the others to see
                    raise
            # After the state machine applied them: a writer that resumes sees its records.
            if isinstance(e, fx.Committed):
                self._on_committed(e.high_watermark)
            elif isinstance(e, fx.LoadSnapshot):
                self._on_committed(e.snapshot_id.offset)
            elif isinstance(e, fx.LeaderChanged):
                log.info("raft node %d is %s in epoch %d (leader %d, log end %d, high watermark %d)",
                         self.config.node_id, self.core.role.value, e.epoch, e.leader_id, self.core.log.end_offset,
                         self.core.high_watermark)
                if e.leader_id != self.config.node_id:
                    self._fail_commit_waiters()

    def _on_committed(self, high_watermark: int) -> None:
        self.high_watermark = max(self.high_watermark, high_watermark)
        still = []
        for offset, fut in self._commit_waiters:
            if offset < self.high_watermark:
                if not fut.done():
                    fut.set_result(offset)
            else:
                still.append((offset, fut))
        self._commit_waiters = still

    def _fail_commit_waiters(self) -> None:
        """Leadership is lost: what was appended may still be committed by the next leader, or
        truncated, so nothing waiting for it can be told it succeeded."""
        waiters, self._commit_waiters = self._commit_waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(NotLeader("leadership changed before the append was committed"))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(self, e: fx.Send) -> None:
        try:
            # asyncio.timeout, not wait_for, which in Python 3.11 loses a cancellation that
            # arrives with the answer
            async with asyncio.timeout(self.config.request_timeout_ms / 1000):
                if e.address is None:
                    body = await self._send_fn(e.dest, e.api_key, e.version, e.body)
                else:
                    body = await self._send_fn(e.dest, e.api_key, e.version, e.body, address=e.address)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("raft request %d to %d failed: %r", e.api_key, e.dest, exc)
            gone = isinstance(exc, (ConnectionRefusedError, ConnectionResetError, BrokenPipeError,
                                    asyncio.IncompleteReadError))
            self._feed(self.core.request_failed(e.request_id, self.now(), unreachable=gone))
            return
        self._feed(self.core.handle_response(e.request_id, to_fields(body), self.now()))

    async def _flush(self, e: fx.FlushLog) -> None:
        async with self._flush_lock:
            await asyncio.to_thread(self.file.flush)
        self._feed(self.core.on_flushed(e.end_offset, e.generation, self.now()))

    async def _run_timer(self) -> None:
        # A flag, not only cancel(): wait_for may swallow a cancellation that races its timeout.
        while not self._closed:
            delay = max(0.0, (self.core.next_deadline() - self.now()) / 1000)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except TimeoutError:
                pass
            if not self._closed:
                self._feed(self.core.tick(self.now()))
            self._wake.clear()

    async def _watch_for_stalls(self) -> None:
        """A short timer that finds itself late means this process was held (by the interpreter
        or the machine): no timer could run, and neither could the answers waiting in the
        sockets. That time is left out of the core's clock, so a stall every node of the quorum
        shared does not count towards fetch timeouts or the leader's check of its quorum and
        look like a lost leader. A real failure is noticed as late as the stall was long. Its
        timer comes due before the core's deadlines it would otherwise hide, so it runs first."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            due = loop.time() + STALL_CHECK_S
            await asyncio.sleep(STALL_CHECK_S)
            late = loop.time() - due
            if late > STALL_S:
                self._held_ms += int(late * 1000)


def _wall_clock_times(response: dict, offset_ms: float) -> None:
    """DescribeQuorum reports fetch times in milliseconds since the epoch, as Kafka does; the
    core keeps them on the driver's monotonic clock."""
    for topic in response.get("topics", []):
        for part in topic.get("partitions", []):
            for replica in (*part.get("current_voters", []), *part.get("observers", [])):
                for key in ("last_fetch_timestamp", "last_caught_up_timestamp"):
                    if replica.get(key, -1) >= 0:
                        replica[key] = int(replica[key] + offset_ms)


class _Barrier:
    """An effect of the driver's own: resolves once every effect queued before it has run."""

    def __init__(self, done: asyncio.Future) -> None:
        self.done = done
