"""A KRaft broker's controller channel asks the quorum's leader first: a controller that accepts
connections but never answers (a SIGSTOPped process, say) must not hold a request."""

from __future__ import annotations

import asyncio

from strom.protocol.messages import encode_response, parse_header
from strom.server.kraft.controller_channel import ControllerChannel

BROKER_HEARTBEAT = 63


async def _serve(answer: bool, received: list[int]) -> asyncio.Server:
    """A fake controller that records the api key of each request; `answer`: it answers as an
    active controller, otherwise it answers nothing, ever."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                payload = await reader.readexactly(size)
                received.append(int.from_bytes(payload[:2], "big"))
                if answer:
                    header, _ = parse_header(payload)
                    writer.write(encode_response(header, {
                        "throttle_time_ms": 0, "error_code": 0, "is_caught_up": True, "is_fenced": False,
                        "should_shut_down": False}))
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_the_known_leader_is_asked_before_a_silent_controller():
    to_silent: list[int] = []
    to_leader: list[int] = []

    async def run() -> None:
        silent, leader = await _serve(False, to_silent), await _serve(True, to_leader)
        silent_port, leader_port = (s.sockets[0].getsockname()[1] for s in (silent, leader))
        config = {"controller.quorum.voters": f"1@127.0.0.1:{silent_port},2@127.0.0.1:{leader_port}",
                  "controller.quorum.bootstrap.servers": ""}
        channel = ControllerChannel(config, "test", None, lambda: ("127.0.0.1", leader_port))
        try:
            body = await channel.call(BROKER_HEARTBEAT, 1, {
                "broker_id": 1, "broker_epoch": 5, "current_metadata_offset": 0, "want_fence": False,
                "want_shut_down": False}, timeout_s=10)
            assert body.error_code == 0 and body.is_caught_up
        finally:
            channel.close()
            silent.close()
            leader.close()

    # The silent controller comes first in the voters: asked first, it would hold the call for
    # its whole deadline.
    asyncio.run(run())
    assert (to_silent, to_leader) == ([], [BROKER_HEARTBEAT])
