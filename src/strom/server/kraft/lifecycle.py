"""BrokerLifecycleManager (KIP-631): a KRaft broker's registration and heartbeats.

The broker registers with the active controller (its listeners, rack and supported features)
and gets its broker epoch; it starts fenced. Every broker.heartbeat.interval.ms it heartbeats
with the metadata offset its parts have acted on (published, not only read); once that is past
its registration the controller unfences it and it may lead partitions. A controller that hears nothing for
broker.session.timeout.ms fences it. At shut-down it heartbeats with want_shut_down: the
controller moves its leadership away and says when it may go (controlled shutdown). A
heartbeat refused with STALE_BROKER_EPOCH or BROKER_ID_NOT_REGISTERED (the controller forgot
this registration) registers again.

Registration and heartbeats run on a thread of their own with its own event loop and
connection (as Kafka's lifecycle manager has its own event queue): a broker loop busy for
longer than broker.session.timeout.ms still heartbeats, and is not fenced for it. What the
broker waits on (`unfenced`, `may_shut_down`) are events of the broker's loop, set from there.

KIP-966's clean-shutdown rule: closing after the log manager's clean shutdown puts this
broker's epoch in the `.kafka_cleanshutdown` marker of each dir it registered (Kafka's JSON,
`{"version":0,"brokerEpoch":N}`); the next start reads it before its log manager's start-up
removes the markers (`read_clean_shutdown_epoch`) and registers with it as PreviousBrokerEpoch
(`previous_broker_epoch`). The controller counts the restart clean only when that is the epoch
it last registered, else the broker leaves every ELR. KIP-1066: heartbeats (v2) name the
directory ids of the cordoned log dirs, asked of `cordoned_log_dirs` at each heartbeat so that
a dynamic change of cordoned.log.dirs reaches the controller with the next one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from strom.config.broker import BrokerConfig, Listener
from strom.controller.features import SUPPORTED
from strom.controller.loop_thread import LoopThread
from strom.log.manager import CLEAN_SHUTDOWN_FILE
from strom.metadata.model import SECURITY_PROTOCOLS
from strom.metadata.storage import StorageError, parse_kafka_uuid, read_meta
from strom.protocol.errors import ErrorCode
from strom.server.kraft.controller_channel import ControllerChannel, ControllerUnavailable

log = logging.getLogger(__name__)

BROKER_REGISTRATION, BROKER_HEARTBEAT = 62, 63
REGISTRATION_VERSION = 4
HEARTBEAT_VERSION = 2  # KIP-1066: CordonedLogDirs
CLEAN_SHUTDOWN_VERSION = 0  # of the marker's JSON


def read_clean_shutdown_epoch(log_dirs: Sequence[Path], live_dirs: Sequence[Path]) -> int:
    """The broker epoch a clean shutdown left in the markers, to be read before the log
    manager's start-up removes them; -1 (unclean) unless every log dir is live and each marker
    names the same epoch (Kafka's readBrokerEpochFromCleanShutdownFiles)."""
    if len(live_dirs) < len(log_dirs):
        return -1
    epochs = set()
    for d in live_dirs:
        try:
            content = json.loads((Path(d) / CLEAN_SHUTDOWN_FILE).read_text(encoding="utf-8"))
            epoch = content["brokerEpoch"]
        except (OSError, ValueError, TypeError, KeyError) as e:
            log.info("no broker epoch in the clean shutdown marker of %s: %s", d, e)
            return -1
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            return -1
        epochs.add(epoch)
    if len(epochs) != 1:
        log.info("the clean shutdown markers name different broker epochs: %s", sorted(epochs))
        return -1
    return epochs.pop()


def write_clean_shutdown_epoch(dirs: Iterable[Path], broker_epoch: int) -> None:
    """Put `broker_epoch` in the clean-shutdown marker of each of `dirs` that has one (the log
    manager writes a marker only where its shutdown made every log durable), durably."""
    text = json.dumps({"version": CLEAN_SHUTDOWN_VERSION, "brokerEpoch": broker_epoch}, separators=(",", ":"))
    for d in dirs:
        marker = Path(d) / CLEAN_SHUTDOWN_FILE
        try:  # never created here: a marker is the log manager's to make (and a next start's to remove)
            fd = os.open(marker, os.O_WRONLY | os.O_TRUNC)
        except FileNotFoundError:
            continue
        except OSError as e:
            log.error("cannot write the broker epoch into %s: %s", marker, e)
            continue
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        except OSError as e:  # the marker stays (empty or partial): the restart only counts as unclean
            log.error("cannot write the broker epoch into %s: %s", marker, e)
        finally:
            os.close(fd)


class BrokerLifecycleManager:
    def __init__(self, config: BrokerConfig, cluster_id: str, channel: ControllerChannel,
                 metadata_offset: Callable[[], int], log_dirs: list[uuid.UUID] | None = None,
                 previous_broker_epoch: int = -1,
                 cordoned_log_dirs: Callable[[], Iterable[Path]] | None = None) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.cluster_id = cluster_id
        self.channel = channel
        self.metadata_offset = metadata_offset
        self.log_dirs = list(log_dirs or [])  # the directory.id of each online log dir (KIP-858)
        # The epoch of the last clean shutdown (read_clean_shutdown_epoch), -1 if none: sent as
        # PreviousBrokerEpoch by every registration of this incarnation, as Kafka's.
        self.previous_broker_epoch = previous_broker_epoch
        # The cordoned log dirs as the broker's current config has them (a dynamic change
        # replaces the config object), else those of the config given here.
        self.cordoned_log_dirs = cordoned_log_dirs or (lambda: self.config.cordoned_log_dirs)
        self._dir_ids: dict[Path, uuid.UUID] = {}  # registered log dir -> its directory.id (at start)
        self.incarnation_id = uuid.uuid4()
        self.broker_epoch = -1
        self.fenced = True
        self.caught_up = False
        self.want_shut_down = False
        # Events of the broker's loop (set through _home); the rest lives on the thread's loop.
        self.may_shut_down = asyncio.Event()
        self.unfenced = asyncio.Event()
        self._may_go = False
        self._listeners: list[Listener] = []
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._home: asyncio.AbstractEventLoop | None = None
        self._thread: LoopThread | None = None

    @property
    def interval_s(self) -> float:
        return self.config["broker.heartbeat.interval.ms"] / 1000

    async def start(self, listeners: list[Listener]) -> None:
        """Register (retrying until a controller answers), then heartbeat in the background."""
        self._listeners = listeners
        self._home = asyncio.get_running_loop()
        self._dir_ids = await asyncio.to_thread(self._registered_dirs)
        self._thread = LoopThread(f"broker-{self.broker_id}-heartbeats")
        await self._thread.call(self._begin())

    async def _begin(self) -> None:
        await self._register()
        self._task = asyncio.get_running_loop().create_task(self._heartbeats(), name="broker-heartbeats")

    def _on_home(self, callback: Callable[[], object]) -> None:
        """Run `callback` on the broker's loop (the events it awaits are that loop's)."""
        if self._home is not None and not self._home.is_closed():
            self._home.call_soon_threadsafe(callback)

    async def _register(self) -> None:
        fields = {
            "broker_id": self.broker_id, "cluster_id": self.cluster_id, "incarnation_id": self.incarnation_id,
            "listeners": [{"name": x.name, "host": x.host, "port": x.port,
                           "security_protocol": SECURITY_PROTOCOLS.get(self.config.protocol_of(x.name), 0)}
                          for x in self._listeners],
            "features": [{"name": n, "min_supported_version": f.min_level, "max_supported_version": f.max_level}
                         for n, f in sorted(SUPPORTED.items())],
            "rack": self.config["broker.rack"], "is_migrating_zk_broker": False, "log_dirs": self.log_dirs,
            "previous_broker_epoch": self.previous_broker_epoch}
        deadline = time.monotonic() + self.config["initial.broker.registration.timeout.ms"] / 1000
        while True:
            try:
                body = await self.channel.call(BROKER_REGISTRATION, REGISTRATION_VERSION, fields, timeout_s=10)
            except ControllerUnavailable as e:
                if self.broker_epoch < 0 and time.monotonic() > deadline:
                    raise ConnectionError(f"broker {self.broker_id} could not register with a controller within "
                                          "initial.broker.registration.timeout.ms") from e
                log.info("broker %d not registered yet: %s", self.broker_id, e)
                continue
            error = ErrorCode(body.error_code)
            if error == ErrorCode.NONE:
                self.broker_epoch, self.fenced = body.broker_epoch, True
                self._on_home(self.unfenced.clear)
                log.info("broker %d registered with the controller: broker epoch %d", self.broker_id,
                         self.broker_epoch)
                return
            if error == ErrorCode.INCONSISTENT_CLUSTER_ID:
                raise ValueError(f"the controller's cluster is not {self.cluster_id} (meta.properties)")
            log.info("broker %d registration refused: %s; retrying", self.broker_id, error.name)
            await asyncio.sleep(self.interval_s / 2)

    async def _heartbeats(self) -> None:
        while True:
            sent = time.monotonic()
            try:
                await self._heartbeat()
            except ControllerUnavailable as e:
                log.warning("broker %d heartbeat not answered: %s", self.broker_id, e)
            except Exception:
                log.exception("broker %d heartbeat failed", self.broker_id)
            if self._may_go:
                return
            # Faster while fenced or shutting down: the state it waits for comes sooner.
            wait = self.interval_s if not self.fenced and not self.want_shut_down else min(self.interval_s, 0.1)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, wait - (time.monotonic() - sent)))
            except TimeoutError:
                pass

    def _registered_dirs(self) -> dict[Path, uuid.UUID]:
        """Each log dir this incarnation registers (live at its start) and its directory.id,
        from meta.properties as the log manager checked it."""
        registered = set(self.log_dirs)
        out = {}
        for d in self.config.log_dirs:
            try:
                meta = read_meta(d)
                dir_id = parse_kafka_uuid(meta.directory_id) if meta is not None and meta.directory_id else None
            except (OSError, StorageError):
                continue
            if dir_id in registered:
                out[d] = dir_id
        return out

    def cordoned_dir_ids(self) -> list[uuid.UUID]:
        """The directory.id of each registered log dir cordoned.log.dirs names now."""
        return [self._dir_ids[d] for d in self.cordoned_log_dirs() if d in self._dir_ids]

    async def _heartbeat(self) -> None:
        fields = {"broker_id": self.broker_id, "broker_epoch": self.broker_epoch,
                  "current_metadata_offset": self.metadata_offset(), "want_fence": False,
                  "want_shut_down": self.want_shut_down, "offline_log_dirs": [],
                  "cordoned_log_dirs": self.cordoned_dir_ids()}
        body = await self.channel.call(BROKER_HEARTBEAT, HEARTBEAT_VERSION, fields,
                                       timeout_s=self.config["broker.session.timeout.ms"] / 1000)
        error = ErrorCode(body.error_code)
        if error in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
            log.warning("broker %d: controller answered %s; registering again", self.broker_id, error.name)
            await self._register()
            return
        if error != ErrorCode.NONE:
            log.warning("broker %d heartbeat: %s", self.broker_id, error.name)
            return
        self.caught_up = body.is_caught_up
        if self.fenced != body.is_fenced:
            log.info("broker %d is %s (broker epoch %d)", self.broker_id,
                     "fenced" if body.is_fenced else "unfenced", self.broker_epoch)
        self.fenced = body.is_fenced
        self._on_home(self.unfenced.clear if self.fenced else self.unfenced.set)
        if body.should_shut_down:
            self._may_go = True
            self._on_home(self.may_shut_down.set)

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        """Ask to shut down and wait until the controller has moved this broker's leadership
        away (True), or the timeout passes or no controller answers (False)."""
        if self._task is None or self.broker_epoch < 0 or self._thread is None:
            return False
        self.want_shut_down = True
        self._thread.loop.call_soon_threadsafe(self._wake.set)
        try:
            await asyncio.wait_for(self.may_shut_down.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    async def close(self) -> None:
        """Stop heartbeating; after the log manager's clean shutdown (it runs first), leave this
        broker's epoch in the markers it wrote."""
        if self._thread is not None:
            await self._thread.call(self._end())
            self._thread.stop()
            self._thread = None
        else:
            self.channel.close()
        if self.broker_epoch >= 0:  # only registered dirs: one offline at start may hold an older marker
            await asyncio.to_thread(write_clean_shutdown_epoch, list(self._dir_ids), self.broker_epoch)

    async def _end(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.channel.close()
