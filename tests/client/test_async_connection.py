"""A call on an AsyncConnection that is cancelled just as its answer arrives ends cancelled,
and so does an open cancelled as it connects.
With asyncio.wait_for (Python 3.11) the answer won and the cancellation was lost, so a loop
of calls that nobody else stopped (a replica fetcher at the loop's exit) went on for ever."""

import asyncio

from strom.client.connection import AsyncConnection
from strom.protocol.messages import RequestHeader, encode_response

API_VERSIONS = 18


class Writer:
    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass


def test_a_cancellation_that_meets_the_answer_is_not_lost() -> None:
    """Cancelled at each turn of the loop around the answer's arrival: a cancellation the
    task accepts (cancel() is True) must end it cancelled, never with the answer."""

    async def scenario(turns: int) -> tuple[bool, bool]:
        reader = asyncio.StreamReader()
        conn = AsyncConnection(reader, Writer(), "t")
        call = asyncio.create_task(conn.call(API_VERSIONS, 0, {}))
        await asyncio.sleep(0)  # the call waits for the answer's size
        header = RequestHeader(API_VERSIONS, 0, 1, "t", False)
        reader.feed_data(encode_response(header, {"error_code": 0, "api_keys": []}))
        for _ in range(turns):
            await asyncio.sleep(0)
        accepted = call.cancel()
        try:
            await call
        except asyncio.CancelledError:
            return accepted, True
        return accepted, False

    outcomes = [asyncio.run(scenario(turns)) for turns in range(4)]
    assert outcomes[0] == (True, True)  # cancelled as the answer arrives
    for turns, (accepted, cancelled) in enumerate(outcomes):
        assert cancelled == accepted, f"cancel() after {turns} turns: accepted {accepted}, cancelled {cancelled}"


def test_a_cancellation_that_meets_the_connection_is_not_lost() -> None:
    """The same for opening a connection: cancelled at each turn of the loop while it connects
    to a listening socket, an accepted cancellation ends the open cancelled."""

    async def scenario(turns: int) -> tuple[bool, bool]:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            opening = asyncio.create_task(AsyncConnection.open("127.0.0.1", port, "t", timeout_s=5))
            for _ in range(turns):
                await asyncio.sleep(0)
            accepted = opening.cancel()
            try:
                (await opening).close()
            except asyncio.CancelledError:
                return accepted, True
            return accepted, False
        finally:
            server.close()

    outcomes = [asyncio.run(scenario(turns)) for turns in range(8)]
    for turns, (accepted, cancelled) in enumerate(outcomes):
        assert cancelled == accepted, f"cancel() after {turns} turns: accepted {accepted}, cancelled {cancelled}"
