"""How a KRaft broker reaches the active controller (Kafka's NodeToControllerChannelManager):
over the controller listener, to whichever controller leads the quorum.

The controllers are known from controller.quorum.voters or .bootstrap.servers; the quorum's
leader as this node's Raft driver knows it is asked first (a controller that is stopped but
still accepts connections would otherwise hold a request until its deadline), then the one that
answered last, and a NOT_CONTROLLER answer (or a refused connection) moves on to the next,
until one is active or the deadline passes. One connection at a time, one request in
flight per caller: registration, heartbeats, AlterPartition and forwarded admin requests are
few, and each waits for its answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from strom.client import ClientSecurity, ConnectionCache
from strom.protocol.errors import ErrorCode
from strom.raft.config import parse_bootstrap_servers, parse_voters

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
RETRY_BACKOFF_S = 0.1


class ControllerUnavailable(ConnectionError):
    pass


def not_controller(body: Any) -> bool:
    """An answer from a controller that is not the active one (top-level or per topic)."""
    if getattr(body, "error_code", 0) == ErrorCode.NOT_CONTROLLER:
        return True
    entries = [x for name in ("topics", "responses", "results", "entries", "filter_results")
               for x in (getattr(body, name, None) or ())]
    return any(getattr(t, "error_code", 0) == ErrorCode.NOT_CONTROLLER for t in entries)


class ControllerChannel:
    def __init__(self, config: Any, client_id: str, security: ClientSecurity | None,
                 leader: Callable[[], tuple[str, int] | None] = lambda: None) -> None:
        self.leader = leader  # where the quorum's leader listens, when known
        voters = parse_voters(config["controller.quorum.voters"])
        addresses = [(v.endpoints[0].host, v.endpoints[0].port) for v in voters]
        addresses += list(parse_bootstrap_servers(config["controller.quorum.bootstrap.servers"]))
        self.addresses = list(dict.fromkeys(addresses))
        if not self.addresses:
            raise ValueError("a KRaft broker needs controller.quorum.voters or controller.quorum.bootstrap.servers")
        self._conns = ConnectionCache(client_id, security, CONNECT_TIMEOUT_S)
        self._closed = False

    async def call(self, api_key: int, version: int, fields: dict[str, Any], timeout_s: float = 30.0) -> Any:
        """The active controller's answer (ControllerUnavailable if none answers in time)."""
        deadline = time.monotonic() + timeout_s
        last = "no controller tried"
        while not self._closed:
            known = self.leader()
            for address in list(dict.fromkeys([*([known] if known else []), *self.addresses])):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    body = await self._call(address, api_key, version, fields, left)
                except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError) as e:
                    last = f"{address[0]}:{address[1]}: {e or type(e).__name__}"
                    continue
                if not_controller(body):
                    last = f"{address[0]}:{address[1]} is not the active controller"
                    continue
                if address in self.addresses and self.addresses[0] != address:  # ask this one first next time
                    self.addresses.remove(address)
                    self.addresses.insert(0, address)
                return body
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(RETRY_BACKOFF_S)
        raise ControllerUnavailable(f"no active controller answered within {timeout_s:g} s: the controller quorum "
                                    f"has no leader (a majority of the controllers down?) or this node cannot "
                                    f"reach it ({last})")

    async def _call(self, address: tuple[str, int], api_key: int, version: int, fields: dict, timeout_s: float):
        return await self._conns.call(address, address, api_key, version, fields, timeout_s,
                                      min(CONNECT_TIMEOUT_S, timeout_s))

    def close(self) -> None:
        self._closed = True
        self._conns.close()
