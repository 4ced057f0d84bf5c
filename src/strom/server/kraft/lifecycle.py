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
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

from strom.config.broker import BrokerConfig, Listener
from strom.controller.features import SUPPORTED
from strom.controller.loop_thread import LoopThread
from strom.metadata.model import SECURITY_PROTOCOLS
from strom.protocol.errors import ErrorCode
from strom.server.kraft.controller_channel import ControllerChannel, ControllerUnavailable

log = logging.getLogger(__name__)

BROKER_REGISTRATION, BROKER_HEARTBEAT = 62, 63
REGISTRATION_VERSION, HEARTBEAT_VERSION = 4, 1


class BrokerLifecycleManager:
    def __init__(self, config: BrokerConfig, cluster_id: str, channel: ControllerChannel,
                 metadata_offset: Callable[[], int], log_dirs: list[uuid.UUID] | None = None) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.cluster_id = cluster_id
        self.channel = channel
        self.metadata_offset = metadata_offset
        self.log_dirs = list(log_dirs or [])  # the directory.id of each online log dir (KIP-858)
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
            "previous_broker_epoch": self.broker_epoch}
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

    async def _heartbeat(self) -> None:
        fields = {"broker_id": self.broker_id, "broker_epoch": self.broker_epoch,
                  "current_metadata_offset": self.metadata_offset(), "want_fence": False,
                  "want_shut_down": self.want_shut_down, "offline_log_dirs": []}
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
        if self._thread is None:
            self.channel.close()
            return
        await self._thread.call(self._end())
        self._thread.stop()
        self._thread = None

    async def _end(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.channel.close()
