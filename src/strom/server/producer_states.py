"""The broker's upkeep of its partitions' producer states (idempotent and transactional
producers): forgetting producers idle for `producer.id.expiration.ms`, and writing snapshots,
at each recovery-point checkpoint and at shut-down, so that a start-up does not re-read whole
logs to rebuild them."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from strom.log.index import in_parallel

log = logging.getLogger(__name__)

PARTITIONS_PER_TURN = 5000


class ProducerStates:
    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def expire(self) -> None:
        now, expiration = int(time.time() * 1000), self.broker.config["producer.id.expiration.ms"]
        removed = sum(p.producer_state.remove_expired(now, expiration)
                      for p in self.broker.replica_manager.partitions.values() if p.producer_state_loaded)
        if removed:
            log.info("forgot %d idle producer states (producer.id.expiration.ms=%d)", removed, expiration)

    async def snapshot(self, at_shutdown: bool = False) -> None:
        """Producer state is encoded on the loop that owns it and written from threads. At
        shutdown every partition whose state was read and moved since its last snapshot gets
        one, even without producers (Kafka snapshots on close), so that the next start-up does
        not re-read whole logs to rebuild the state."""
        snapshots = []
        partitions = list(self.broker.replica_manager.partitions.values())
        for start in range(0, len(partitions), PARTITIONS_PER_TURN):  # 100,000: yield in between
            if start:
                await asyncio.sleep(0)
            snapshots += [(p.producer_state, *snap) for p in partitions[start:start + PARTITIONS_PER_TURN]
                          if not p.log.offline and (snap := p.producer_snapshot(at_shutdown)) is not None]

        def write(snapshot) -> None:
            state, offset, data = snapshot
            try:
                state.write_snapshot(offset, data)
            except OSError as e:  # a failing log dir must not stop the rest
                log.error("cannot write producer snapshot in %s: %s", state.dir, e)

        if snapshots:  # many at once: their fsyncs are committed together
            await asyncio.to_thread(in_parallel, write, snapshots)
