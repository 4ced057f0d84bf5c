"""How a controller's Raft driver reaches the other controllers: one connection per (node, API),
so a long-polling Fetch never holds up a Vote, to the address the node is known at: its entry
in the voter set (controller.quorum.voters, or KIP-853's VotersRecord), one of
controller.quorum.bootstrap.servers (ids -2, -3, ...), or the leader endpoints answers carry
(KIP-853's NodeEndpoints), which is how a controller that knows no voter set yet finds them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from strom.client import AsyncConnection, ClientSecurity
from strom.raft.config import QuorumConfig
from strom.raft.voters import VoterSet

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0


class RaftTransport:
    def __init__(self, config: QuorumConfig, listener: str, voters: Callable[[], VoterSet],
                 security: ClientSecurity | None = None) -> None:
        self.config = config
        self.listener = listener
        self.voters = voters  # the voter set in force, from the Raft core
        self.security = security
        self.learned: dict[int, tuple[str, int]] = {}
        self._conns: dict[tuple[int, int], AsyncConnection] = {}
        self._locks: dict[tuple[int, int], asyncio.Lock] = {}
        self._closed = False

    def address(self, node: int) -> tuple[str, int]:
        if node <= -2:
            return self.config.bootstrap_servers[-2 - node]
        voter = self.voters().get(node)
        if voter is not None and voter.endpoints:
            chosen = next((e for e in voter.endpoints if e.name == self.listener), voter.endpoints[0])
            return chosen.host, chosen.port
        static = next((v for v in self.config.voters if v.voter_id == node), None)
        if static is not None:
            return static.endpoints[0].host, static.endpoints[0].port
        if node in self.learned:
            return self.learned[node]
        raise LookupError(f"no address known for controller {node}")

    async def __call__(self, node: int, api_key: int, version: int, fields: dict[str, Any]) -> Any:
        if self._closed:
            raise ConnectionError("transport closed")
        key = (node, api_key)
        async with self._locks.setdefault(key, asyncio.Lock()):
            conn = self._conns.get(key)
            if conn is None:
                host, port = self.address(node)
                conn = await AsyncConnection.open(host, port, f"raft-{self.config.node_id}", CONNECT_TIMEOUT_S,
                                                  security=self.security)
                self._conns[key] = conn
            try:
                body = await conn.call(api_key, version, fields, timeout_s=self.config.request_timeout_ms / 1000 + 1)
            except BaseException:
                self._conns.pop(key, None)
                conn.close()
                raise
        for endpoint in getattr(body, "node_endpoints", None) or ():
            self.learned[endpoint.node_id] = (endpoint.host, endpoint.port)
        return body

    def close(self) -> None:
        self._closed = True
        for conn in self._conns.values():
            with contextlib.suppress(Exception):
                conn.close()
        self._conns.clear()
