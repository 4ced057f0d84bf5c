"""A broker's controlled shutdown asks the controller it knows; when that one answers
NOT_CONTROLLER (it resigned meanwhile, stopping too), the broker asks the successor as soon as
it is known instead of waiting out controlled.shutdown.retry.backoff.ms."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

from strom.protocol.errors import ErrorCode
from strom.server import store_lifecycle
from strom.server.store_lifecycle import StoreLifecycle


class _Cache:
    def __init__(self, controller_id: int) -> None:
        self.controller_id = controller_id

    async def wait_for(self, condition, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return condition()


def test_not_controller_sends_the_request_to_the_successor_at_once(monkeypatch, caplog):
    asked: list[str] = []
    cache = _Cache(controller_id=3)

    class ResigningController:  # broker 3, answering while it stops
        @classmethod
        async def open(cls, host, port, client_id, security=None):
            return cls()

        async def call(self, api_key, version, fields):
            asked.append("broker 3")
            asyncio.get_running_loop().call_later(0.05, setattr, cache, "controller_id", 2)
            return SimpleNamespace(error_code=ErrorCode.NOT_CONTROLLER, remaining_partitions=[])

        def close(self) -> None:
            pass

    async def deliver_local(api_key, version, fields):  # this broker, the new controller
        asked.append("itself")
        return SimpleNamespace(error_code=ErrorCode.NONE, remaining_partitions=[])

    monkeypatch.setattr(store_lifecycle, "AsyncConnection", ResigningController)
    fake = SimpleNamespace(
        broker_id=2, broker_epoch=7, metadata_cache=cache, deliver_local=deliver_local,
        broker_endpoint=lambda node: ("127.0.0.1", 1), inter_broker_security=None,
        config={"controlled.shutdown.max.retries": 3, "controlled.shutdown.retry.backoff.ms": 5000})
    caplog.set_level(logging.INFO, logger="strom.server.store_lifecycle")
    started = time.monotonic()
    asyncio.run(StoreLifecycle(fake).controlled_shutdown())
    assert asked == ["broker 3", "itself"]
    assert time.monotonic() - started < 2  # not the 5 s backoff
    assert "still led here" not in caplog.text and "succeeded" in caplog.text
