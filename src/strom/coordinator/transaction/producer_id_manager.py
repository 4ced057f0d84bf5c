"""Producer ids, handed out from blocks reserved in the metadata store.

As in Kafka, a broker reserves a block of ids at `/latest_producer_id_block` with a
conditional write, and hands them out from memory; after a restart it reserves a fresh block,
so an id is never given out twice even if the broker dies mid-block.
"""

from __future__ import annotations

from strom.controller.store import BadVersion, MetadataStore, NodeExists

BLOCK_PATH = "/latest_producer_id_block"
BLOCK_SIZE = 1000


class ProducerIdManager:
    def __init__(self, store: MetadataStore, broker_id: int) -> None:
        self.store = store
        self.broker_id = broker_id
        self._next = 0
        self._end = -1  # last id of the current block; none reserved yet

    def _reserve_block(self) -> None:
        while True:
            node = self.store.get(BLOCK_PATH)
            start = 0 if node is None else node[0]["block_end"] + 1
            version = -1 if node is None else node[1]
            block = {"version": 1, "broker": self.broker_id, "block_start": start,
                     "block_end": start + BLOCK_SIZE - 1}
            try:
                if node is None:
                    self.store.create(BLOCK_PATH, block)  # conditional: the first block once
                else:
                    self.store.set(BLOCK_PATH, block, expected_version=version)
            except (BadVersion, NodeExists):
                continue  # another broker took that block; read again
            self._next, self._end = start, start + BLOCK_SIZE - 1
            return

    def generate(self) -> int:
        if self._next > self._end:
            self._reserve_block()
        pid = self._next
        self._next += 1
        return pid
