"""The quorum controller in one process on a one-voter Raft quorum over real files: what each
request writes to the metadata log, how the committed image changes, and that the image comes
back from the log and its snapshots after a restart."""

from __future__ import annotations

import asyncio
import hmac as hmac_lib
import uuid
from types import SimpleNamespace

import pytest
from one_voter import FEATURES, start_controller, stop_controller

from strom.controller import cluster_control, quorum_controller, replication_control
from strom.controller.features import FeatureUpdate
from strom.controller.quorum_controller import QuorumController
from strom.controller.replication_control import Change, Limits, NewTopic
from strom.controller.token_control import TokenControl
from strom.metadata.image import MetadataImage
from strom.protocol.errors import ErrorCode, KafkaError


async def _start(directory, *, session_ms: int = 600_000, snapshot_bytes: int = 20 << 20, limits=None,
                 tokens: TokenControl | None = None, token_check_s: float = 3600.0):
    return await start_controller(directory, limits=limits or Limits(default_replication_factor=3),
                                  session_ms=session_ms, snapshot_bytes=snapshot_bytes, tokens=tokens,
                                  token_check_s=token_check_s)


_stop = stop_controller


def _registration(broker_id: int, rack: str | None = None):
    return SimpleNamespace(broker_id=broker_id, cluster_id="c1", incarnation_id=uuid.uuid4(), rack=rack,
                           listeners=[SimpleNamespace(name="PLAINTEXT", host="h", port=9000 + broker_id,
                                                      security_protocol=0)],
                           features=[], log_dirs=[uuid.uuid4()])


def _heartbeat(broker_id: int, epoch: int, *, fence=False, shut_down=False, offset=1 << 40):
    return SimpleNamespace(broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=offset,
                           want_fence=fence, want_shut_down=shut_down)


async def _brokers(controller: QuorumController, ids) -> dict[int, int]:
    epochs = {b: await controller.register_broker(_registration(b)) for b in ids}
    for b, epoch in epochs.items():
        state = await controller.heartbeat(_heartbeat(b, epoch))
        assert not state.is_fenced and state.is_caught_up
    return epochs


def _create(controller, *topics, validate_only=False):
    limits = controller.settings.limits
    return controller.write("create", lambda img: replication_control.create_topics(
        img, [NewTopic(*t) for t in topics], limits, validate_only))


def test_topics_brokers_and_elections(tmp_path):
    async def main():
        c = await _start(tmp_path / "m")
        try:
            assert c.image.features == FEATURES  # the bootstrap records of a new cluster
            registered = await c.register_broker(_registration(1))
            assert c.image.brokers[1].fenced and c.image.brokers[1].epoch == registered
            behind = await c.heartbeat(_heartbeat(1, registered, offset=registered - 1))
            assert behind.is_fenced and not behind.is_caught_up  # not caught up to its registration
            epochs = {1: registered, **await _brokers(c, [2, 3])}
            assert (await c.heartbeat(_heartbeat(1, registered))).is_fenced is False
            with pytest.raises(KafkaError) as stale:
                await c.heartbeat(_heartbeat(1, registered - 1))
            assert stale.value.code == ErrorCode.STALE_BROKER_EPOCH

            result = await _create(c, ("orders", 6, 3, {}, {"retention.ms": "1000"}),
                                   ("too-wide", 1, 4, {}, {}), ("__cluster_metadata", 1, 1, {}, {}),
                                   ("bad", 1, 1, {}, {}))
            assert result["too-wide"].code == ErrorCode.INVALID_REPLICATION_FACTOR
            assert result["__cluster_metadata"].code == ErrorCode.INVALID_REQUEST
            topic_id, replicas = result["orders"]
            topic = c.image.topics["orders"]
            assert topic.topic_id == topic_id and len(topic.partitions) == 6
            assert c.image.topic_configs("orders") == {"retention.ms": "1000"}
            for i, s in topic.partitions.items():
                assert s.replicas == replicas[i] and s.leader == replicas[i][0] and s.isr == replicas[i]
            again = await _create(c, ("orders", 1, 1, {}, {}))
            assert again["orders"].code == ErrorCode.TOPIC_ALREADY_EXISTS

            # Fencing broker 1: it leads nothing and is in no ISR; the others lead in its place.
            led = [i for i, s in topic.partitions.items() if s.leader == 1]
            await c.heartbeat(_heartbeat(1, epochs[1], fence=True))
            for i, s in c.image.topics["orders"].partitions.items():
                assert s.leader != 1 and 1 not in s.isr
                if i in led:
                    assert s.leader_epoch == 1 and s.leader == [r for r in s.replicas if r != 1][0]
            # Unfenced again, it is back in no ISR until its leader asks (AlterPartition), but a
            # preferred election gives it back what it should lead once it is in sync.
            await c.heartbeat(_heartbeat(1, epochs[1]))
            part = c.image.topics["orders"].partitions[led[0]]
            alter = SimpleNamespace(partition_index=led[0], leader_epoch=part.leader_epoch,
                                    partition_epoch=part.partition_epoch, new_isr=part.replicas)
            records, answer = replication_control.alter_partition(c.image, part.leader, "orders", alter)
            assert answer["error_code"] == ErrorCode.NONE
            await c.write("alter", lambda _img: Change(records))
            elected = await c.write("elect", lambda img: replication_control.elect_leaders(img, 0, [("orders", led[0])]))
            assert elected[("orders", led[0])] == (ErrorCode.NONE, None)
            assert c.image.topics["orders"].partitions[led[0]].leader == 1

            # Controlled shutdown: leadership moves first, then the broker is told to go.
            first = await c.heartbeat(_heartbeat(2, epochs[2], shut_down=True))
            assert not first.should_shut_down and c.image.brokers[2].in_controlled_shutdown
            assert not any(s.leader == 2 for s in c.image.topics["orders"].partitions.values())
            second = await c.heartbeat(_heartbeat(2, epochs[2], shut_down=True))
            assert second.should_shut_down and c.image.brokers[2].fenced

            deleted = await c.write("delete", lambda img: replication_control.delete_topics(
                img, ["orders", "__consumer_offsets", "missing"], c.settings.limits))
            assert deleted["orders"] == topic_id
            assert deleted["__consumer_offsets"].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert deleted["missing"].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert "orders" not in c.image.topics and not c.image.configs
        finally:
            await _stop(c)

    asyncio.run(main())


def test_partitions_reassignment_features_and_configs(tmp_path):
    async def main():
        c = await _start(tmp_path / "m")
        try:
            await _brokers(c, [1, 2, 3, 4])
            created = await _create(c, ("t", -1, -1, {0: [1, 2], 1: [2, 3]}, {}))
            assert created["t"][1] == {0: [1, 2], 1: [2, 3]}
            limits = c.settings.limits
            counts = replication_control.replica_counts(c.image)
            await c.write("grow", lambda img: replication_control.create_partitions(img, "t", 4, None, limits, counts))
            assert len(c.image.topics["t"].partitions) == 4
            with pytest.raises(KafkaError) as shrink:
                await c.write("grow", lambda img: replication_control.create_partitions(img, "t", 3, None, limits, {}))
            assert shrink.value.code == ErrorCode.INVALID_PARTITIONS

            # Phase one: replicas become target + original; phase two once the ISR holds the target.
            moved = await c.write("move", lambda img: replication_control.alter_reassignments(img, [("t", 0, [3, 4])]))
            assert moved[("t", 0)] == (ErrorCode.NONE, None)
            s = c.image.topics["t"].partitions[0]
            assert s.replicas == [3, 4, 1, 2] and s.adding == [3, 4] and s.removing == [1, 2]
            assert set(replication_control.list_reassignments(c.image, None)) == {("t", 0)}
            alter = SimpleNamespace(partition_index=0, leader_epoch=s.leader_epoch, partition_epoch=s.partition_epoch,
                                    new_isr=[1, 2, 3, 4])
            records, answer = replication_control.alter_partition(c.image, s.leader, "t", alter)
            await c.write("alter", lambda _img: Change(records))
            done = c.image.topics["t"].partitions[0]
            assert done.replicas == [3, 4] and done.leader == 3 and done.isr == [3, 4] and not done.adding
            assert answer["leader_id"] == 3

            results = await c.write("features", lambda img: cluster_control.update_features(
                img, [FeatureUpdate("group.version", 0, 2)]))
            assert results["group.version"][0] == ErrorCode.NONE and "group.version" not in c.image.features
            refused = await c.write("features", lambda img: cluster_control.update_features(
                img, [FeatureUpdate("metadata.version", 7, 2)]))
            assert refused["metadata.version"][0] == ErrorCode.INVALID_UPDATE_VERSION
            assert c.image.features["metadata.version"] == 25

            ops = [(0, "cleanup.policy", "compact"), (2, "cleanup.policy", "delete"), (0, "retention.ms", "5")]
            await c.write("configs", lambda img: Change(cluster_control.alter_configs(
                img, 2, "t", ops, lambda *_: None, lambda key: key == "cleanup.policy")))
            assert c.image.topic_configs("t") == {"cleanup.policy": "compact,delete", "retention.ms": "5"}
            await c.write("configs", lambda img: Change(cluster_control.alter_configs(
                img, 2, "t", [(1, "retention.ms", None)], lambda *_: None, lambda _k: False)))
            assert c.image.topic_configs("t") == {"cleanup.policy": "compact,delete"}
        finally:
            await _stop(c)

    asyncio.run(main())


def test_an_expired_session_fences_the_broker(tmp_path):
    async def main():
        c = await _start(tmp_path / "m", session_ms=300)
        try:
            epochs = await _brokers(c, [1, 2])
            await _create(c, ("t", -1, -1, {0: [1, 2]}, {}))
            for _ in range(40):  # broker 2 keeps its session; broker 1 goes silent
                await c.heartbeat(_heartbeat(2, epochs[2]))
                await asyncio.sleep(0.05)
            assert c.image.brokers[1].fenced and not c.image.brokers[2].fenced
            s = c.image.topics["t"].partitions[0]
            assert s.leader == 2 and s.isr == [2]
        finally:
            await _stop(c)

    asyncio.run(main())


def test_heartbeats_are_heard_while_a_large_change_waits_to_commit(tmp_path):
    """A heartbeat keeps its broker's session alive on arrival and, changing nothing, is
    answered at once: a write held before its commit (as a change of 100,000 records is) must
    not let every broker's session run out behind it."""
    async def main():
        c = await _start(tmp_path / "m", session_ms=300)
        try:
            epochs = await _brokers(c, [1, 2])
            gate = asyncio.Event()
            append = c.driver.append

            async def held(*args, **kwargs):
                await gate.wait()
                return await append(*args, **kwargs)

            c.driver.append = held
            creating = asyncio.ensure_future(_create(c, ("t", -1, -1, {0: [1, 2]}, {})))
            await asyncio.sleep(0.05)
            assert not creating.done()
            for _ in range(20):  # 1 s: three session timeouts
                for b in (1, 2):
                    state = await asyncio.wait_for(c.heartbeat(_heartbeat(b, epochs[b])), 0.5)
                    assert not state.is_fenced
                await asyncio.sleep(0.05)
            gate.set()
            await creating
            for _ in range(5):  # a fence queued behind the write would be committed by now
                for b in (1, 2):
                    await c.heartbeat(_heartbeat(b, epochs[b]))
                await asyncio.sleep(0.05)
            assert not c.image.brokers[1].fenced and not c.image.brokers[2].fenced
            assert c.image.topics["t"].partitions[0].isr == [1, 2]
        finally:
            await _stop(c)

    asyncio.run(main())


def test_the_whole_cluster_stopping_and_coming_back(tmp_path):
    """Every broker asks to shut down at once: each hands on what another can still take, and
    the last is let go with what nobody can take (its partitions left without a leader, their
    ISR kept), not held until its session ends. Back and caught up, it leads them again."""
    async def main():
        c = await _start(tmp_path / "m")
        try:
            epochs = await _brokers(c, [1, 2, 3])
            await _create(c, ("t", -1, -1, {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]}, {}))
            for b in (1, 2, 3):
                first = await c.heartbeat(_heartbeat(b, epochs[b], shut_down=True))
                assert not first.should_shut_down
            parts = c.image.topics["t"].partitions
            assert all(s.leader == 3 and s.isr == [3] for s in parts.values())  # the last to ask
            for b in (1, 2, 3):
                assert (await c.heartbeat(_heartbeat(b, epochs[b], shut_down=True))).should_shut_down
            parts = c.image.topics["t"].partitions
            assert all(s.leader == -1 and s.isr == [3] for s in parts.values())

            epochs[1] = await c.register_broker(_registration(1))
            await c.heartbeat(_heartbeat(1, epochs[1]))  # not in any ISR: it leads nothing
            assert all(s.leader == -1 for s in c.image.topics["t"].partitions.values())
            epochs[3] = await c.register_broker(_registration(3))
            assert not (await c.heartbeat(_heartbeat(3, epochs[3]))).is_fenced
            parts = c.image.topics["t"].partitions
            assert all(s.leader == 3 and s.isr == [3] for s in parts.values())
        finally:
            await _stop(c)

    asyncio.run(main())


def test_the_image_comes_back_from_log_and_snapshots(tmp_path, monkeypatch):
    monkeypatch.setattr(quorum_controller, "MAX_RECORDS_PER_BATCH", 50)  # large changes: a transaction
    monkeypatch.setattr(quorum_controller, "_REPLAY_OFF_LOOP", 30)  # encoded and replayed in a worker thread

    async def main():
        c = await _start(tmp_path / "m", snapshot_bytes=4096)
        try:
            await _brokers(c, [1, 2, 3])
            for i in range(8):
                await _create(c, (f"t{i}", 40, 3, {}, {"retention.ms": str(i)}))
            before = _state(c)
            offset = c.image.end_offset
        finally:
            await _stop(c)
        snapshots = sorted((tmp_path / "m").glob("*.checkpoint"))
        assert snapshots, "no snapshot was written"
        again = await _start(tmp_path / "m")
        try:
            assert again.image.end_offset >= offset and _state(again) == before
        finally:
            await _stop(again)

    asyncio.run(main())


def _state(c: QuorumController) -> tuple:
    img = c.image
    return (img.features, {b: (x.epoch, x.fenced) for b, x in img.brokers.items()},
            {n: (t.topic_id, t.partitions) for n, t in img.topics.items()}, img.configs)


def test_delegation_tokens_on_the_quorum(tmp_path):
    """Create, renew and expire write DelegationTokenRecords (RemoveDelegationTokenRecord when
    expired at once) with the KRaft controller's rules; the periodic sweep removes a token
    past its expiry time; the image keeps what was written across a restart."""
    async def main():
        tokens = TokenControl(b"secret", max_lifetime_ms=7 * 86_400_000, renew_ms=86_400_000)
        c = await _start(tmp_path / "m", tokens=tokens, token_check_s=0.05)
        try:
            now = quorum_controller.wall_clock_ms()
            info, hmac = await c.write("create", lambda img: tokens.create(img, "User:alice", "User:admin",
                                                                           ["User:bob"], -1, now))
            assert hmac == hmac_lib.digest(b"secret", info.token_id.encode(), "sha512")
            rec = c.image.delegation_tokens[info.token_id]
            assert (rec.owner, rec.requester, list(rec.renewers)) == ("User:alice", "User:admin", ["User:bob"])
            assert rec.max_timestamp == now + 7 * 86_400_000 and rec.expiration_timestamp == now + 86_400_000
            # A renewal period above delegation.token.expiry.time.ms is capped by it.
            expiry = await c.write("renew", lambda img: tokens.renew(img, "User:bob", hmac, 10 * 86_400_000, now + 5))
            assert expiry == now + 5 + 86_400_000 == c.image.delegation_tokens[info.token_id].expiration_timestamp
            with pytest.raises(KafkaError) as e:
                await c.write("renew", lambda img: tokens.renew(img, "User:eve", hmac, -1, now))
            assert e.value.code == ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH
            with pytest.raises(KafkaError) as e:
                await c.write("renew", lambda img: tokens.renew(img, "User:alice", b"x" * 64, -1, now))
            assert e.value.code == ErrorCode.DELEGATION_TOKEN_NOT_FOUND
            # Expired, a token cannot be renewed (checked before its owner, as Kafka's controller).
            with pytest.raises(KafkaError) as e:
                await c.write("renew", lambda img: tokens.renew(img, "User:eve", hmac, -1, now + 2 * 86_400_000))
            assert e.value.code == ErrorCode.DELEGATION_TOKEN_EXPIRED
            # A second token, expired at once by its owner: removed from the image.
            second, second_hmac = await c.write("create", lambda img: tokens.create(img, "User:carol", "User:carol",
                                                                                    [], 1000, now))
            assert second.max_ms == now + 1000 and second.expiry_ms == now + 1000  # max lifetime asked for
            assert await c.write("expire", lambda img: tokens.expire(img, "User:carol", second_hmac, -1, now)) == now
            assert second.token_id not in c.image.delegation_tokens
            # Expiry moved to 50 ms from now: the sweep (every 50 ms here) removes the token.
            soon = quorum_controller.wall_clock_ms()
            assert await c.write("expire", lambda img: tokens.expire(img, "User:alice", hmac, 50, soon)) == soon + 50
            for _ in range(200):
                if info.token_id not in c.image.delegation_tokens:
                    break
                await asyncio.sleep(0.02)
            assert info.token_id not in c.image.delegation_tokens
            # Renewers must be users.
            with pytest.raises(KafkaError) as e:
                await c.write("create", lambda img: tokens.create(img, "User:a", "User:a", ["Group:g"], -1, now))
            assert e.value.code == ErrorCode.INVALID_PRINCIPAL_TYPE
            kept, _ = await c.write("create", lambda img: tokens.create(img, "User:dan", "User:dan", [], -1, now))
        finally:
            await _stop(c)
        c = await _start(tmp_path / "m", tokens=tokens)
        try:
            assert set(c.image.delegation_tokens) == {kept.token_id}
        finally:
            await _stop(c)

    asyncio.run(main())


def test_delegation_tokens_off_or_too_old_a_metadata_version():
    image = MetadataImage()
    image.features["metadata.version"] = 25
    with pytest.raises(KafkaError) as e:
        TokenControl(None, 1000, 1000).create(image, "User:a", "User:a", [], -1, 0)
    assert e.value.code == ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED
    image.features["metadata.version"] = 13  # 3.6-IV1: before the log carried tokens
    with pytest.raises(KafkaError) as e:
        TokenControl(b"s", 1000, 1000).create(image, "User:a", "User:a", [], -1, 0)
    assert e.value.code == ErrorCode.UNSUPPORTED_VERSION


def test_registration_log_directories():
    """KIP-858's checks of the directory ids a broker registers (metadata.version 3.7-IV2 on)."""
    image = MetadataImage()
    image.features["metadata.version"] = 25
    first = _registration(1)
    image.replay(cluster_control.register_broker(image, first, "c1", 5, {}, 0.0, 9.0).records[0])
    assert image.brokers[1].log_dirs == first.log_dirs
    bad = {"No directories": [], "Reserved directory": [uuid.UUID(int=1)],
           "Duplicate directory": [uuid.UUID(int=7 << 64)] * 2,
           "Broker 1 is already registered": first.log_dirs}
    for message, dirs in bad.items():
        request = _registration(2)
        request.log_dirs = dirs
        with pytest.raises(KafkaError, match=message) as e:
            cluster_control.register_broker(image, request, "c1", 6, {}, 0.0, 9.0)
        assert e.value.code == ErrorCode.INVALID_REGISTRATION
    again = _registration(1)  # the same broker again with its dir: fine
    again.log_dirs = first.log_dirs
    assert cluster_control.register_broker(image, again, "c1", 7, {}, 0.0, 9.0).records[0].log_dirs == first.log_dirs
    image.features["metadata.version"] = 16  # before 3.7-IV2: not checked
    old = _registration(3)
    old.log_dirs = []
    assert cluster_control.register_broker(image, old, "c1", 8, {}, 0.0, 9.0).records
