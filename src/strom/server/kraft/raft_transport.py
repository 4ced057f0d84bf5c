"""How a controller's Raft driver reaches the other controllers: one connection per (node, API),
so a long-polling Fetch never holds up a Vote, to the address the node is known at: its entry
in the voter set (controller.quorum.voters, or KIP-853's VotersRecord), one of
controller.quorum.bootstrap.servers (ids -2, -3, ...), or the leader endpoints answers carry
(KIP-853's NodeEndpoints), which is how a controller that knows no voter set yet finds them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from strom.client import ClientSecurity, ConnectionCache
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
        self._conns = ConnectionCache(f"raft-{config.node_id}", security, CONNECT_TIMEOUT_S)  # by (node, api)
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
        body = await self._conns.call((node, api_key), lambda: self.address(node), api_key, version, fields,
                                      self.config.request_timeout_ms / 1000 + 1)
        for endpoint in getattr(body, "node_endpoints", None) or ():
            self.learned[endpoint.node_id] = (endpoint.host, endpoint.port)
        return body

    def close(self) -> None:
        self._closed = True
        self._conns.close()
