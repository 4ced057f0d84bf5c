"""The order of a new controller's first requests (onControllerFailover): brokers already
serving hear of it, with every partition's state, before its elections' LeaderAndIsr; its own
broker, when starting, hears only after the LeaderAndIsr naming what it hosts."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from strom.controller import znodes
from strom.controller.controller import KafkaController
from strom.controller.store import LocalMetadataStore
from strom.metadata.model import BrokerInfo, EndPoint, PartitionState

LEADER_AND_ISR, UPDATE_METADATA = 4, 6


class RecordingChannel:
    """Stands in for the controller's connections: keeps what would be sent, in order."""

    listener = "PLAINTEXT"

    def __init__(self) -> None:
        self.sent: list[tuple[int, int, dict]] = []

    def add_broker(self, broker) -> None:
        pass

    def remove_broker(self, broker_id: int) -> None:
        pass

    def send(self, broker_id: int, api_key: int, fields: dict, callback=None) -> None:
        self.sent.append((broker_id, api_key, fields))

    async def drain(self, timeout_s: float = 0) -> None:
        pass

    def shutdown(self) -> None:
        pass


def _cluster(store: LocalMetadataStore, partitions: int) -> None:
    """Brokers 1 and 2 registered; broker 3, which led every partition, is gone."""
    for b in (1, 2):
        info = BrokerInfo(b, [EndPoint("PLAINTEXT", "127.0.0.1", 9000 + b)])
        store.create(f"{znodes.BROKER_IDS}/{b}", info.encode(), ephemeral=True)
    assignment = {p: [3, 1, 2] for p in range(partitions)}
    store.create(znodes.topic_path("t"), znodes.encode_assignment(uuid.uuid4(), assignment))
    for p in range(partitions):
        store.create(znodes.partition_state_path("t", p),
                     PartitionState(3, 5, [3, 1, 2], [3, 1, 2], controller_epoch=1).encode())


async def _io(fn, *args, **kwargs):
    return fn(*args, **kwargs)


@pytest.mark.parametrize("starting", [True, False], ids=["own broker starting", "own broker serving"])
def test_serving_brokers_learn_the_new_controller_before_its_elections(tmp_path, starting):
    store = LocalMetadataStore(tmp_path / "metadata.json")
    _cluster(store, 10)
    channel = RecordingChannel()
    controller = KafkaController(store, _io, 1, lambda: channel, own_thread=False)
    controller.restarted = starting

    async def run() -> None:
        await controller.startup()
        assert controller.is_active
        await controller.shutdown()

    asyncio.run(run())
    order = [(b, api) for b, api, _ in channel.sent]
    # Broker 2 serves: an UpdateMetadata naming the new controller and every partition, with
    # the dead broker offline, comes before the LeaderAndIsr of the elections.
    first_um = order.index((2, UPDATE_METADATA))
    assert first_um < order.index((2, LEADER_AND_ISR))
    fields = channel.sent[first_um][2]
    assert fields["controller_id"] == 1
    assert {b["id"] for b in fields["live_brokers"]} == {1, 2}
    states = [s for t in fields["topic_states"] for s in t["partition_states"]]
    assert sorted(s["partition_index"] for s in states) == list(range(10))
    assert all(s["leader"] == 3 and s["offline_replicas"] == [3] for s in states)
    # Then the new leaders, elected among the live ISR members.
    led = [s for b, api, f in channel.sent if b == 2 and api == LEADER_AND_ISR
           for t in f["topic_states"] for s in t["partition_states"]]
    assert {s["leader"] for s in led} == {1} and all(s["leader_epoch"] == 6 for s in led)
    # This controller's own broker: if starting, its first UpdateMetadata follows its LeaderAndIsr.
    own_first_um = order.index((1, UPDATE_METADATA))
    if starting:
        assert order.index((1, LEADER_AND_ISR)) < own_first_um
    else:
        assert own_first_um < order.index((1, LEADER_AND_ISR))
