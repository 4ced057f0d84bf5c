"""Cordoned log dirs (KIP-1066) at the quorum controller: a broker's heartbeat names its
cordoned dirs, the controller records them (BrokerRegistrationChangeRecord v3) and places no
new replica on a broker whose dirs are all cordoned, unless an assignment names it."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

from one_voter import start_controller

from strom.controller import cluster_control, replication_control
from strom.controller.quorum_controller import QuorumController
from strom.controller.replication_control import Limits, NewTopic
from strom.metadata import records as r
from strom.metadata.image import MetadataImage


async def _start(directory) -> QuorumController:
    return await start_controller(directory)


def _heartbeat(broker_id: int, epoch: int, cordoned=None):
    return SimpleNamespace(broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=1 << 40,
                           want_fence=False, want_shut_down=False, cordoned_log_dirs=cordoned)


def test_no_new_replica_on_a_broker_whose_dirs_are_all_cordoned(tmp_path):
    async def main():
        c = await _start(tmp_path / "m")
        try:
            dirs = {b: [uuid.uuid4(), uuid.uuid4()] for b in (1, 2, 3)}
            epochs = {}
            for b in (1, 2, 3):
                epochs[b] = await c.register_broker(SimpleNamespace(
                    broker_id=b, cluster_id="c1", incarnation_id=uuid.uuid4(), rack=None, features=[],
                    listeners=[SimpleNamespace(name="PLAINTEXT", host="h", port=9000 + b, security_protocol=0)],
                    log_dirs=dirs[b], previous_broker_epoch=-1))
                assert not (await c.heartbeat(_heartbeat(b, epochs[b]))).is_fenced

            def create(name: str, assignment=None):
                return c.write("create", lambda img: replication_control.create_topics(
                    img, [NewTopic(name, 6 if assignment is None else -1, 2 if assignment is None else -1,
                                   assignment or {}, {})], Limits(), False))

            # One of broker 3's dirs cordoned: it still takes replicas (into the other one).
            await c.heartbeat(_heartbeat(3, epochs[3], cordoned=[dirs[3][0], uuid.uuid4()]))
            assert c.image.brokers[3].cordoned_log_dirs == [dirs[3][0]] and not c.image.brokers[3].cordoned
            await c.heartbeat(_heartbeat(3, epochs[3], cordoned=dirs[3]))  # now both
            assert c.image.brokers[3].cordoned
            steady = cluster_control.steady_heartbeat(c.image, _heartbeat(3, epochs[3], cordoned=dirs[3]),
                                                      c.sessions[3])
            assert steady is not None and not steady.is_fenced  # unchanged: answered at once

            await create("spread")
            assert all(3 not in s.replicas for s in c.image.topics["spread"].partitions.values())
            await create("named", {0: [3, 1]})  # an assignment may still name it
            assert c.image.topics["named"].partitions[0].replicas == [3, 1]

            image = MetadataImage()  # the snapshot keeps the cordon
            image.replay_values([r.encode(rec) for rec in c.image.records()])
            assert image.brokers[3].cordoned_log_dirs == dirs[3]

            await c.heartbeat(_heartbeat(3, epochs[3], cordoned=[]))  # uncordoned
            await create("again")
            assert any(3 in s.replicas for s in c.image.topics["again"].partitions.values())
            await c.heartbeat(_heartbeat(3, epochs[3]))  # BrokerHeartbeat v1 says nothing: kept as is
            assert c.image.brokers[3].cordoned_log_dirs == []
        finally:
            await c.close()
            await c.driver.close()

    asyncio.run(main())
