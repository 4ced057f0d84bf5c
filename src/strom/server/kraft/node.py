"""KafkaRaftServer (seed 001): a node with `process.roles` set.

Start-up checks that every directory was formatted (`strom storage format`) for this node and
one cluster, then starts the controller (process.roles has `controller`: the Raft quorum and
the QuorumController, on a thread of their own) and the broker (`broker`), and shuts them down
in the reverse order. A dedicated controller holds the `.lock` of its metadata directory as a
broker holds its log dirs', so a second process cannot open the same metadata log.
"""

from __future__ import annotations

import logging

from strom.config.broker import BrokerConfig, Listener
from strom.log.config import LogConfig
from strom.log.manager import LogManager
from strom.metadata.storage import MetaProperties, ensure_formatted
from strom.server.kraft.broker import KRaftBroker
from strom.server.kraft.controller_server import ControllerServer

log = logging.getLogger(__name__)


class KafkaRaftServer:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.node_id = config.broker_id
        self.roles = config.process_roles
        self.controller: ControllerServer | None = None
        self.broker: KRaftBroker | None = None
        self.meta: MetaProperties | None = None
        self._lock: LogManager | None = None

    @property
    def broker_id(self) -> int:
        return self.node_id

    @property
    def cluster_id(self) -> str:
        return self.meta.cluster_id if self.meta else ""

    @property
    def advertised(self) -> list[Listener]:
        """Listeners as the ready line names them: the broker's, then the controller's."""
        out = list(self.broker.advertised) if self.broker is not None else []
        return out + (list(self.controller.advertised) if self.controller is not None else [])

    @property
    def metrics_server(self):
        if self.broker is not None:
            return self.broker.metrics_server
        return self.controller.metrics_server if self.controller is not None else None

    async def startup(self) -> None:
        config = self.config
        self.meta = ensure_formatted(config.log_dirs, config.metadata_log_dir, self.node_id)
        if "broker" not in self.roles:
            self._lock = LogManager([config.metadata_log_dir], LogConfig())
            self._lock.lock_dirs()
        if "controller" in self.roles:
            self.controller = ControllerServer(config, self.meta)
            await self.controller.startup()
        if "broker" in self.roles:
            self.broker = KRaftBroker(config, self.controller)
            await self.broker.startup()
        log.info("node %d (%s) started in cluster %s", self.node_id, ",".join(self.roles), self.cluster_id)

    async def shutdown(self) -> None:
        if self.broker is not None:
            await self.broker.shutdown()
        if self.controller is not None:
            await self.controller.shutdown()
        if self._lock is not None:
            self._lock.unlock_dirs()
