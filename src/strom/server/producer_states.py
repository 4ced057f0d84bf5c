"""The broker's upkeep of its partitions' producer states (idempotent and transactional
producers): forgetting producers idle for `producer.id.expiration.ms`, and writing snapshots,
at each recovery-point checkpoint and at shut-down, so that a start-up does not re-read whole
logs to rebuild them."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger(__name__)


class ProducerStates:
    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def expire(self) -> None:
        now, expiration = int(time.time() * 1000), self.broker.config["producer.id.expiration.ms"]
        removed = sum(p.producer_state.remove_expired(now, expiration)
                      for p in self.broker.replica_manager.partitions.values())
        if removed:
            log.info("forgot %d idle producer states (producer.id.expiration.ms=%d)", removed, expiration)

    async def snapshot(self, at_shutdown: bool = False) -> None:
        """Producer state is encoded on the loop that owns it and written from a thread. At
        shutdown every partition gets one, even empty (Kafka snapshots on close), so that the
        next start-up does not re-read whole logs to rebuild the state."""
        snapshots = [(p.producer_state, *snap) for p in self.broker.replica_manager.partitions.values()
                     if not p.log.offline and (snap := p.producer_snapshot(at_shutdown)) is not None]

        def write() -> None:
            for state, offset, data in snapshots:
                try:
                    state.write_snapshot(offset, data)
                except OSError as e:  # a failing log dir must not stop the rest
                    log.error("cannot write producer snapshot in %s: %s", state.dir, e)

        if snapshots:
            await asyncio.to_thread(write)
