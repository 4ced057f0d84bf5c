"""InitProducerId when the broker has no producer id to give yet (a KRaft broker whose block
from the controller has not come): answered with the retriable error, as Kafka answers it,
not by closing the client's connection."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from strom.protocol.errors import ErrorCode, KafkaError
from strom.server.apis.producer_id import handle_init_producer_id


class _NoBlockYet:
    def generate(self) -> int:
        raise KafkaError("no producer id block from the controller yet", ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)


def test_no_producer_id_yet_is_a_retriable_answer():
    broker = SimpleNamespace(authorizer=None, producer_id_manager=_NoBlockYet(),
                             txn_coordinator=SimpleNamespace(init_producer_id=lambda *_: _NoBlockYet().generate()))
    ctx = SimpleNamespace(header=SimpleNamespace(api_version=4))
    for transactional_id in (None, "txn"):
        request = SimpleNamespace(transactional_id=transactional_id, transaction_timeout_ms=60000,
                                  producer_id=-1, producer_epoch=-1)
        answer = asyncio.run(handle_init_producer_id(broker, ctx, request))
        assert answer["error_code"] == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert answer["producer_id"] == -1
