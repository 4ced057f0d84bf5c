"""A KRaft broker's registration and heartbeats (BrokerLifecycleManager) against a fake
controller on a thread of its own: they keep going while the broker's event loop is busy, so a
stalled loop does not get the broker fenced."""

from __future__ import annotations

import asyncio
import threading
import time

from strom.config.broker import Listener, load
from strom.controller.loop_thread import LoopThread
from strom.protocol.messages import encode_response, parse_request
from strom.server.kraft.controller_channel import ControllerChannel
from strom.server.kraft.lifecycle import BrokerLifecycleManager

BROKER_REGISTRATION, BROKER_HEARTBEAT = 62, 63
EPOCH = 17


class FakeController:
    """Answers BrokerRegistration with EPOCH and every BrokerHeartbeat as unfenced, from its own
    loop, recording when each heartbeat arrived (and whether it asked to shut down)."""

    def __init__(self) -> None:
        self.thread = LoopThread("fake-controller")
        self.heartbeats: list[tuple[float, bool]] = []
        self.lock = threading.Lock()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.thread.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                payload = await reader.readexactly(int.from_bytes(await reader.readexactly(4), "big"))
                request = parse_request(payload)
                header = request.header
                if header.api_key == BROKER_REGISTRATION:
                    body = {"throttle_time_ms": 0, "error_code": 0, "broker_epoch": EPOCH}
                else:
                    want_shut_down = bool(request.body.want_shut_down)
                    with self.lock:
                        self.heartbeats.append((time.monotonic(), want_shut_down))
                    body = {"throttle_time_ms": 0, "error_code": 0, "is_caught_up": True, "is_fenced": False,
                            "should_shut_down": want_shut_down}
                writer.write(encode_response(header, body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def arrived_between(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for t, _ in self.heartbeats if start <= t <= end)

    def close(self) -> None:
        self.thread.loop.call_soon_threadsafe(self.server.close)
        self.thread.stop()


def test_heartbeats_go_on_while_the_brokers_loop_is_busy():
    controller = FakeController()
    config = load(None, ["broker.heartbeat.interval.ms=100", "broker.session.timeout.ms=1000",
                         f"controller.quorum.voters=1@127.0.0.1:{controller.port}"])
    channel = ControllerChannel(config, "test-lifecycle", None)
    lifecycle = BrokerLifecycleManager(config, "cluster", channel, lambda: 5)

    async def run() -> None:
        await lifecycle.start([Listener("PLAINTEXT", "127.0.0.1", 9092)])
        assert lifecycle.broker_epoch == EPOCH
        await asyncio.wait_for(lifecycle.unfenced.wait(), 10)  # set on this loop, from the thread
        # The broker's loop does 1.5 s of work without yielding: longer than the session.
        start = time.monotonic()
        time.sleep(1.5)
        end = time.monotonic()
        assert controller.arrived_between(start + 0.2, end) >= 5, controller.heartbeats[-10:]
        # Controlled shutdown through the heartbeat: asked from this loop, answered on it.
        assert await lifecycle.controlled_shutdown(10)
        assert controller.heartbeats[-1][1] and not controller.heartbeats[0][1]
        await lifecycle.close()

    try:
        asyncio.run(run())
    finally:
        controller.close()
