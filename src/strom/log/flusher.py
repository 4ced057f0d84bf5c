"""The flush policy: when segments are fsynced, always off the event loop.

Kafka's rules, applied per log with its LogConfig:

- after a roll, everything before the new segment (Kafka's `flushUptoOffsetExclusive`), so
  the recovery point follows the data and a crash re-scans only the newest segment;
- `flush.messages` (broker: log.flush.interval.messages): once that many records are above
  the recovery point; Kafka flushes inside the append, Strom starts the fsync right after the
  append and holds the produce response until it is done (`wait_durable`), so the client
  hears back only about records that are on disk;
- `flush.ms` (broker: log.flush.interval.ms): when the last flush is that old, checked every
  log.flush.scheduler.interval.ms (1 s when that is left at Kafka's never);
- clean shutdown: everything (LogManager.shutdown).

`Log.flush` advances the recovery point, which the recovery-point checkpoint persists.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from strom.log.log import Log, wall_clock_ms

log = logging.getLogger(__name__)


class LogFlusher:
    """Collects flush requests from the loop and runs them in a worker thread, one log at a
    time; a request for a log already waiting just raises its target offset."""

    def __init__(self, on_error: Callable[[Log, BaseException], None],
                 now_ms: Callable[[], int] = wall_clock_ms) -> None:
        self._on_error = on_error
        self._now_ms = now_ms
        self._pending: dict[Log, int] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._waiters: dict[Log, list[tuple[int, asyncio.Future]]] = {}
        self.flushes = 0
        self.observe_flush: Callable[[float], None] = lambda _seconds: None  # metrics' hook

    async def wait_durable(self, target: Log, offset: int) -> None:
        """Return once `target` is fsynced below `offset`; raises the flush's OSError."""
        if target.recovery_point >= offset:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(target, []).append((offset, future))
        self.request(target, offset)
        await future

    def _release(self, target: Log, error: BaseException | None = None) -> None:
        waiting = self._waiters.pop(target, [])
        still = []
        for offset, future in waiting:
            if future.done():
                continue
            if error is not None:
                future.set_exception(OSError(f"flushing {target.name} failed: {error}"))
            elif target.recovery_point >= offset or target.closed:
                future.set_result(None)
            else:
                still.append((offset, future))
        if still:
            self._waiters[target] = still

    def request(self, target: Log, up_to: int) -> None:
        """Ask for `target` to be flushed up to `up_to` (exclusive). Safe before `start`."""
        if up_to > self._pending.get(target, -1):
            self._pending[target] = up_to
            self._wake.set()

    def check_flush_ms(self, logs: list[Log]) -> int:
        """Request a flush of every log whose flush.ms has elapsed; returns how many."""
        now = self._now_ms()
        due = 0
        for lg in logs:
            if lg.offline or lg.closed or lg.unflushed_messages() <= 0:
                continue
            if now - lg.last_flush_ms >= lg.config.flush_ms:
                self.request(lg, lg.log_end_offset)
                due += 1
        return due

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="log-flusher")

    async def stop(self) -> None:
        """Finish what is pending (the shutdown flush covers anything newer) and stop."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for target in list(self._waiters):
            self._release(target, OSError("broker shutting down before the flush"))

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                target, up_to = self._pending.popitem()
                if target.closed or target.offline or up_to <= target.recovery_point:
                    self._release(target, OSError("log offline") if target.offline else None)
                    continue
                try:
                    started = time.monotonic()
                    await asyncio.to_thread(target.flush, up_to)
                    self.observe_flush(time.monotonic() - started)
                    self.flushes += 1
                    self._release(target)
                except OSError as e:
                    if target.closed:
                        self._release(target)
                        continue  # deleted meanwhile (topic deletion): nothing to make durable
                    log.error("flushing %s failed: %s", target.name, e)
                    self._release(target, e)
                    self._on_error(target, e)
