"""Bad transactional requests over the raw protocol: Kafka's error codes, and the broker keeps
serving afterwards (a produce and read-back after each test, no Traceback in its log).

Error codes as Kafka 3.9's TransactionCoordinator / KafkaApis / LogValidator answer them:
INVALID_PRODUCER_ID_MAPPING (49) for an unknown transactional id or another producer id,
PRODUCER_FENCED (90) for a stale epoch (INVALID_PRODUCER_EPOCH (47) for AddPartitionsToTxn
v0-1), INVALID_TXN_STATE (48) for EndTxn with no transaction, INVALID_RECORD (87) for a control
batch from a client, TRANSACTION_ABORTABLE (120) for a verify-only AddPartitionsToTxn (v4) of a
partition that is not in the transaction.
"""

from __future__ import annotations

import struct
import uuid

import pytest
from confluent_kafka import TopicPartition
from crc32c import crc32c

from strom.protocol.records import ATTRIBUTES_OFFSET, CONTROL_MASK, TRANSACTIONAL_MASK, build_batch
from strom.testing import BrokerProcess, RawClient, create_topic, unique_name, wait_for

from .conftest import Rec, consumer, roundtrip
from .test_groups_errors import joined_member, sync
from .test_transactions import (
    RETRIABLE_COORDINATOR,
    TXN_OVERRIDES,
    describe_txn,
    list_offset,
    read_to_end,
    values,
)

pytestmark = pytest.mark.timeout(60)

PRODUCE, OFFSET_FETCH, FIND_COORDINATOR, INIT_PRODUCER_ID = 0, 9, 10, 22
ADD_PARTITIONS, ADD_OFFSETS, END_TXN, WRITE_TXN_MARKERS, TXN_OFFSET_COMMIT = 24, 25, 26, 27, 28
NONE, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, OUT_OF_ORDER_SEQUENCE = 0, 22, 25, 45
INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING = 47, 48, 49
INVALID_RECORD, PRODUCER_FENCED, TRANSACTION_ABORTABLE = 87, 90, 120
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, UNSTABLE_OFFSET_COMMIT = 53, 88
UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST, OPERATION_NOT_ATTEMPTED = 3, 42, 55


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides=TXN_OVERRIDES) as b:
        yield b


@pytest.fixture
def client(broker):
    c = RawClient(broker)
    yield c
    c.close()


@pytest.fixture
def txn_topic(broker, request) -> str:
    name = unique_name(request.node.name)
    create_topic(broker.bootstrap, name, partitions=2)
    return name


# --- helpers ------------------------------------------------------------------------------------
def coordinator_call(client: RawClient, api_key: int, version: int, fields: dict, code) -> object:
    """Call, retrying while the transaction coordinator is loading or busy (`code` reads the
    error code from the response)."""
    def attempt():
        body = client.call(api_key, version, fields)
        return None if code(body) in RETRIABLE_COORDINATOR else body
    return wait_for(attempt, timeout=15, what=f"api {api_key} past coordinator loading")


def init_txn(client: RawClient, tid: str, timeout_ms: int = 60000) -> tuple[int, int]:
    found = client.call(FIND_COORDINATOR, 3, {"key": tid, "key_type": 1})
    assert found.error_code == NONE, found.error_code
    body = coordinator_call(client, INIT_PRODUCER_ID, 4, {
        "transactional_id": tid, "transaction_timeout_ms": timeout_ms,
        "producer_id": -1, "producer_epoch": -1}, lambda b: b.error_code)
    assert body.error_code == NONE, body.error_code
    return body.producer_id, body.producer_epoch


def add_partitions(client: RawClient, tid: str, pid: int, epoch: int, topic: str, partitions: list[int],
                   version: int = 3) -> list[int]:
    body = coordinator_call(client, ADD_PARTITIONS, version, {
        "v3_and_below_transactional_id": tid, "v3_and_below_producer_id": pid,
        "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": topic, "partitions": partitions}]},
        lambda b: b.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)
    (result,) = body.results_by_topic_v3_and_below
    assert result.name == topic
    return [p.partition_error_code for p in sorted(result.results_by_partition, key=lambda p: p.partition_index)]


def end_txn(client: RawClient, tid: str, pid: int, epoch: int, commit: bool, version: int = 3) -> int:
    return coordinator_call(client, END_TXN, version, {
        "transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "committed": commit},
        lambda b: b.error_code).error_code


def add_offsets(client: RawClient, tid: str, pid: int, epoch: int, group: str) -> int:
    return coordinator_call(client, ADD_OFFSETS, 3, {
        "transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "group_id": group},
        lambda b: b.error_code).error_code


def with_attributes(batch: bytes, attributes: int) -> bytes:
    """The batch with its attributes replaced and the CRC32C recomputed."""
    out = bytearray(batch)
    struct.pack_into(">h", out, ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">I", out, ATTRIBUTES_OFFSET - 4, crc32c(bytes(out[ATTRIBUTES_OFFSET:])))
    return bytes(out)


def produce(client: RawClient, topic: str, batch: bytes, tid: str | None = None, partition: int = 0,
            version: int = 9):
    body = client.call(PRODUCE, version, {"transactional_id": tid, "acks": -1, "timeout_ms": 5000,
                                     "topic_data": [{"name": topic, "partition_data": [
                                         {"index": partition, "records": batch}]}]})
    p = body.responses[0].partition_responses[0]
    return p.error_code, p.base_offset


def still_serving(broker: BrokerProcess) -> None:
    name = unique_name("still-serving")
    create_topic(broker.bootstrap, name)
    roundtrip(broker.bootstrap, name, [Rec(b"still here", partition=0)])
    assert "Traceback" not in broker.log_text()


# --- tests --------------------------------------------------------------------------------------
def test_end_txn_unknown_transactional_id(broker, client):
    tid = "never-initialised-" + uuid.uuid4().hex
    client.call(FIND_COORDINATOR, 3, {"key": tid, "key_type": 1})
    assert end_txn(client, tid, 12345, 0, commit=True) == INVALID_PRODUCER_ID_MAPPING
    assert end_txn(client, tid, 12345, 0, commit=False) == INVALID_PRODUCER_ID_MAPPING
    still_serving(broker)


def test_end_txn_with_no_transaction_is_invalid_state(broker, client):
    tid = unique_name("txn-empty")
    pid, epoch = init_txn(client, tid)
    assert end_txn(client, tid, pid, epoch, commit=True) == INVALID_TXN_STATE
    assert end_txn(client, tid, pid, epoch, commit=False) == INVALID_TXN_STATE
    assert describe_txn(broker.bootstrap, tid).transaction_state == "Empty"
    still_serving(broker)


def test_add_partitions_stale_epoch_and_wrong_producer_id(broker, client, txn_topic):
    tid = unique_name("txn-fenced")
    pid, old_epoch = init_txn(client, tid)
    pid2, epoch = init_txn(client, tid)  # a second init: same producer id, epoch + 1
    assert (pid2, epoch) == (pid, old_epoch + 1)
    assert add_partitions(client, tid, pid, old_epoch, txn_topic, [0]) == [PRODUCER_FENCED]
    assert add_partitions(client, tid, pid, old_epoch, txn_topic, [0], version=2) == [PRODUCER_FENCED]
    assert add_partitions(client, tid, pid, old_epoch, txn_topic, [0], version=1) == [INVALID_PRODUCER_EPOCH]
    assert add_partitions(client, tid, pid + 1000, epoch, txn_topic, [0]) == [INVALID_PRODUCER_ID_MAPPING]
    assert describe_txn(broker.bootstrap, tid).transaction_state == "Empty"  # nothing was added
    # the current epoch works, and EndTxn with the stale one is fenced too
    assert add_partitions(client, tid, pid, epoch, txn_topic, [0, 1]) == [NONE, NONE]
    assert end_txn(client, tid, pid, old_epoch, commit=True) == PRODUCER_FENCED
    assert end_txn(client, tid, pid, epoch, commit=False) == NONE
    still_serving(broker)


def test_add_offsets_with_wrong_epoch_is_fenced(broker, client):
    tid = unique_name("txn-offsets-fenced")
    pid, epoch = init_txn(client, tid)
    group = unique_name("txn-offsets-group")
    assert add_offsets(client, tid, pid, epoch + 1, group) == PRODUCER_FENCED
    assert add_offsets(client, tid, pid, epoch - 1 if epoch else epoch + 5, group) == PRODUCER_FENCED
    assert add_offsets(client, tid, pid + 1000, epoch, group) == INVALID_PRODUCER_ID_MAPPING
    assert add_offsets(client, tid, pid, epoch, group) == NONE
    assert end_txn(client, tid, pid, epoch, commit=False) == NONE
    still_serving(broker)


def test_sequence_gap_is_out_of_order(broker, client, txn_topic):
    body = client.call(INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                             "producer_id": -1, "producer_epoch": -1})
    pid, epoch = body.producer_id, body.producer_epoch
    assert body.error_code == NONE

    def batch(seq: int) -> bytes:
        return build_batch([(None, b"v%d" % i) for i in range(3)], producer_id=pid,
                           producer_epoch=epoch, base_sequence=seq)
    assert produce(client, txn_topic, batch(0)) == (NONE, 0)
    assert produce(client, txn_topic, batch(7))[0] == OUT_OF_ORDER_SEQUENCE
    assert produce(client, txn_topic, batch(3)) == (NONE, 3)
    still_serving(broker)


def test_control_batch_from_a_client_is_invalid_record(broker, client, txn_topic):
    tid = unique_name("txn-forged-marker")
    pid, epoch = init_txn(client, tid)
    assert add_partitions(client, tid, pid, epoch, txn_topic, [0]) == [NONE]
    marker = build_batch([(struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 0))], producer_id=pid,
                         producer_epoch=epoch, base_sequence=0)
    forged = with_attributes(marker, CONTROL_MASK | TRANSACTIONAL_MASK)
    assert produce(client, txn_topic, forged, tid=tid)[0] == INVALID_RECORD
    plain_marker = with_attributes(build_batch([(struct.pack(">hh", 0, 0), struct.pack(">hi", 0, 0))]),
                                   CONTROL_MASK)
    assert produce(client, txn_topic, plain_marker)[0] == INVALID_RECORD
    # the forged COMMIT did not end the transaction: a real abort still applies
    data = with_attributes(build_batch([(None, b"inside")], producer_id=pid, producer_epoch=epoch,
                                       base_sequence=0), TRANSACTIONAL_MASK)
    assert produce(client, txn_topic, data, tid=tid)[0] == NONE
    assert end_txn(client, tid, pid, epoch, commit=False) == NONE
    assert wait_for(lambda: read_to_end(broker.bootstrap, txn_topic, [0], committed=False)[0],
                    what="the aborted record")
    assert read_to_end(broker.bootstrap, txn_topic, [0], committed=True) == {0: []}
    still_serving(broker)


def test_txn_offset_commit_unknown_member_and_generation(broker, client, txn_topic):
    group = unique_name("txn-members")
    member, generation = joined_member(broker.bootstrap, group)
    assert sync(broker.bootstrap, group, member, generation).error_code == NONE
    tid = unique_name("txn-member-commit")
    pid, epoch = init_txn(client, tid)
    assert add_offsets(client, tid, pid, epoch, group) == NONE

    def commit(member_id: str, gen: int) -> int:
        body = coordinator_call(client, TXN_OFFSET_COMMIT, 3, {
            "transactional_id": tid, "group_id": group, "producer_id": pid, "producer_epoch": epoch,
            "generation_id": gen, "member_id": member_id, "group_instance_id": None,
            "topics": [{"name": txn_topic, "partitions": [{"partition_index": 0, "committed_offset": 5,
                                                           "committed_leader_epoch": -1,
                                                           "committed_metadata": ""}]}]},
            lambda b: b.topics[0].partitions[0].error_code)
        return body.topics[0].partitions[0].error_code

    assert commit("no-such-member", generation) == UNKNOWN_MEMBER_ID
    assert commit(member, generation + 7) == ILLEGAL_GENERATION
    assert commit(member, generation) == NONE
    assert end_txn(client, tid, pid, epoch, commit=True) == NONE
    still_serving(broker)


def test_add_partitions_v4_verify_only(broker, client, txn_topic):
    tid = unique_name("txn-verify")
    pid, epoch = init_txn(client, tid)
    assert add_partitions(client, tid, pid, epoch, txn_topic, [0]) == [NONE]

    def v4(verify_only: bool, partitions: list[int], producer_epoch: int = epoch) -> tuple[int, dict[int, int]]:
        body = coordinator_call(client, ADD_PARTITIONS, 4, {"transactions": [{
            "transactional_id": tid, "producer_id": pid, "producer_epoch": producer_epoch,
            "verify_only": verify_only, "topics": [{"name": txn_topic, "partitions": partitions}]}]},
            lambda b: b.error_code or b.results_by_transaction[0].topic_results[0]
            .results_by_partition[0].partition_error_code)
        (result,) = body.results_by_transaction
        assert result.transactional_id == tid
        (topic_result,) = result.topic_results
        return body.error_code, {p.partition_index: p.partition_error_code for p in topic_result.results_by_partition}

    assert v4(True, [0, 1]) == (NONE, {0: NONE, 1: TRANSACTION_ABORTABLE})
    assert v4(True, [1]) == (NONE, {1: TRANSACTION_ABORTABLE})  # verifying added nothing
    assert v4(True, [0], producer_epoch=epoch + 1) == (NONE, {0: PRODUCER_FENCED})
    assert v4(False, [1]) == (NONE, {1: NONE})  # the same request shape, adding
    assert v4(True, [0, 1]) == (NONE, {0: NONE, 1: NONE})
    state = describe_txn(broker.bootstrap, tid)
    assert [(t.topic, sorted(t.partitions)) for t in state.topics] == [(txn_topic, [0, 1])]
    for p in range(2):
        batch = with_attributes(build_batch([(None, b"v4-%d" % p)], producer_id=pid, producer_epoch=epoch,
                                            base_sequence=0), TRANSACTIONAL_MASK)
        assert produce(client, txn_topic, batch, tid=tid, partition=p)[0] == NONE
    assert end_txn(client, tid, pid, epoch, commit=True) == NONE
    got = read_to_end(broker.bootstrap, txn_topic, range(2), committed=True)
    assert [values(got[p]) for p in range(2)] == [["v4-0"], ["v4-1"]]
    still_serving(broker)


def test_write_txn_markers_aborts_a_hanging_transaction(broker, client, txn_topic):
    """WriteTxnMarkers from an admin client (what `kafka-transactions.sh abort` and
    kafka-python's `abort_transaction` send, coordinator epoch -1) ends a transaction the
    coordinator no longer drives; a marker with a stale producer epoch is refused."""
    from kafka.admin import KafkaAdminClient
    from kafka.admin._transactions import AbortTransactionSpec
    from kafka.structs import TopicPartition as KTP

    tid = unique_name("txn-hanging")
    init_txn(client, tid)
    pid, epoch = init_txn(client, tid)
    assert epoch >= 1
    assert add_partitions(client, tid, pid, epoch, txn_topic, [0]) == [NONE]
    batch = with_attributes(build_batch([(None, b"hanging-%d" % i) for i in range(3)], producer_id=pid,
                                        producer_epoch=epoch, base_sequence=0), TRANSACTIONAL_MASK)
    assert produce(client, txn_topic, batch, tid=tid)[0] == NONE
    assert list_offset(broker.bootstrap, txn_topic, 0, isolation=1) == 0

    def markers(producer_epoch: int) -> int:
        body = client.call(WRITE_TXN_MARKERS, 1, {"markers": [{
            "producer_id": pid, "producer_epoch": producer_epoch, "transaction_result": False,
            "topics": [{"name": txn_topic, "partition_indexes": [0]}], "coordinator_epoch": -1}]})
        return body.markers[0].topics[0].partitions[0].error_code

    assert markers(epoch - 1) == INVALID_PRODUCER_EPOCH
    assert list_offset(broker.bootstrap, txn_topic, 0, isolation=1) == 0  # still open
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.abort_transaction(AbortTransactionSpec(KTP(txn_topic, 0), pid, epoch))
    finally:
        admin.close()
    assert list_offset(broker.bootstrap, txn_topic, 0, isolation=1) == 4  # ABORT marker at 3
    assert read_to_end(broker.bootstrap, txn_topic, [0], committed=True) == {0: []}
    assert end_txn(client, tid, pid, epoch, commit=False) == NONE
    still_serving(broker)


def txn_batch(pid: int, epoch: int, seq: int, *values: bytes) -> bytes:
    return with_attributes(build_batch([(None, v) for v in values], producer_id=pid, producer_epoch=epoch,
                                       base_sequence=seq), TRANSACTIONAL_MASK)


def test_transactional_produce_to_partition_not_in_transaction(broker, client, txn_topic):
    """KIP-890 verification: a transactional batch for a partition the transaction never added
    would start a transaction no coordinator knows (a hanging one, the LSO stuck for ever)."""
    tid = unique_name("txn-not-added")
    pid, epoch = init_txn(client, tid)
    assert add_partitions(client, tid, pid, epoch, txn_topic, [0]) == [NONE]
    # Produce v9-10 get INVALID_TXN_STATE; v11 understands TRANSACTION_ABORTABLE (Kafka 3.8+)
    assert produce(client, txn_topic, txn_batch(pid, epoch, 0, b"stray"), tid=tid, partition=1)[0] \
        == INVALID_TXN_STATE
    assert produce(client, txn_topic, txn_batch(pid, epoch, 0, b"stray"), tid=tid, partition=1,
                   version=11)[0] == TRANSACTION_ABORTABLE
    assert list_offset(broker.bootstrap, txn_topic, 1, isolation=0) == 0  # nothing was written
    assert list_offset(broker.bootstrap, txn_topic, 1, isolation=1) == 0
    assert produce(client, txn_topic, txn_batch(pid, epoch, 0, b"fine"), tid=tid, partition=0)[0] == NONE
    assert end_txn(client, tid, pid, epoch, commit=True) == NONE
    got = read_to_end(broker.bootstrap, txn_topic, range(2), committed=True)
    assert [values(got[0]), values(got[1])] == [["fine"], []]
    still_serving(broker)


def test_late_produce_after_timeout_abort_is_fenced(broker, client, txn_topic):
    """The coordinator aborts a timed-out transaction with a bumped epoch, so a batch the
    silent producer sends afterwards (old epoch) is refused instead of opening a new, hanging
    transaction."""
    tid = unique_name("txn-late")
    pid, epoch = init_txn(client, tid, timeout_ms=1000)
    assert add_partitions(client, tid, pid, epoch, txn_topic, [0]) == [NONE]
    assert produce(client, txn_topic, txn_batch(pid, epoch, 0, b"a", b"b", b"c"), tid=tid)[0] == NONE
    wait_for(lambda: describe_txn(broker.bootstrap, tid).transaction_state == "CompleteAbort", timeout=15,
             what="the coordinator to abort the timed-out transaction")
    assert describe_txn(broker.bootstrap, tid).producer_epoch > epoch
    high = list_offset(broker.bootstrap, txn_topic, 0, isolation=0)
    assert high == 4 and list_offset(broker.bootstrap, txn_topic, 0, isolation=1) == 4
    assert produce(client, txn_topic, txn_batch(pid, epoch, 3, b"late"), tid=tid)[0] == INVALID_PRODUCER_EPOCH
    assert produce(client, txn_topic, txn_batch(pid, epoch, 0, b"late"), tid=tid, partition=1)[0] \
        == INVALID_PRODUCER_EPOCH
    assert add_partitions(client, tid, pid, epoch, txn_topic, [0]) == [PRODUCER_FENCED]
    assert end_txn(client, tid, pid, epoch, commit=True) == PRODUCER_FENCED
    for p in range(2):
        assert list_offset(broker.bootstrap, txn_topic, p, isolation=1) == \
            list_offset(broker.bootstrap, txn_topic, p, isolation=0)
    assert read_to_end(broker.bootstrap, txn_topic, range(2), committed=True) == {0: [], 1: []}
    still_serving(broker)


def test_init_producer_id_epoch_bump_kip_360(broker, client):
    """InitProducerId v3+ with the producer's current id and epoch (how clients recover from
    an abortable error without a new id): the epoch is bumped; a retry of the same request
    gets the same answer; an older epoch or another producer id is fenced."""
    tid = unique_name("txn-kip360")
    pid, epoch = init_txn(client, tid)

    def init(producer_id: int, producer_epoch: int, version: int = 4):
        return coordinator_call(client, INIT_PRODUCER_ID, version, {
            "transactional_id": tid, "transaction_timeout_ms": 60000,
            "producer_id": producer_id, "producer_epoch": producer_epoch}, lambda b: b.error_code)

    bumped = init(pid, epoch)
    assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (NONE, pid, epoch + 1)
    retry = init(pid, epoch)  # the response to the bump was lost: the same answer again
    assert (retry.error_code, retry.producer_id, retry.producer_epoch) == (NONE, pid, epoch + 1)
    again = init(pid, epoch + 1)
    assert (again.error_code, again.producer_epoch) == (NONE, epoch + 2)
    assert init(pid, epoch).error_code == PRODUCER_FENCED
    assert init(pid, epoch, version=3).error_code == INVALID_PRODUCER_EPOCH
    assert init(pid + 1000, epoch + 2).error_code == PRODUCER_FENCED
    assert describe_txn(broker.bootstrap, tid).producer_epoch == epoch + 2
    still_serving(broker)


def test_transactional_batch_without_transactional_id(broker, client, txn_topic):
    """A Produce carrying a transactional batch but no transactional id: Kafka's
    `handleProduceRequest` answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53) for the whole
    request before writing anything (a transaction no coordinator knows could never end)."""
    tid = unique_name("txn-no-id")
    pid, epoch = init_txn(client, tid)
    assert add_partitions(client, tid, pid, epoch, txn_topic, [0]) == [NONE]
    assert produce(client, txn_topic, txn_batch(pid, epoch, 0, b"orphan"), tid=None)[0] \
        == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert list_offset(broker.bootstrap, txn_topic, 0, isolation=0) == 0
    assert list_offset(broker.bootstrap, txn_topic, 0, isolation=1) == 0
    assert produce(client, txn_topic, txn_batch(pid, epoch, 0, b"ok"), tid=tid)[0] == NONE
    assert end_txn(client, tid, pid, epoch, commit=True) == NONE
    assert values(read_to_end(broker.bootstrap, txn_topic, [0], committed=True)[0]) == ["ok"]
    still_serving(broker)


def test_offset_fetch_require_stable_is_per_partition(broker, client, txn_topic):
    """Pending transactional offsets make OffsetFetch(require_stable) answer
    UNSTABLE_OFFSET_COMMIT (88) for those partitions only; without require_stable the last
    committed offset is returned; the commit makes the pending offset the committed one."""
    group = unique_name("txn-stable")
    c = consumer(broker.bootstrap, **{"group.id": group})
    try:
        c.commit(offsets=[TopicPartition(txn_topic, p, 1) for p in range(2)], asynchronous=False)
    finally:
        c.close()
    tid = unique_name("txn-stable")
    pid, epoch = init_txn(client, tid)
    assert add_offsets(client, tid, pid, epoch, group) == NONE
    body = coordinator_call(client, TXN_OFFSET_COMMIT, 3, {
        "transactional_id": tid, "group_id": group, "producer_id": pid, "producer_epoch": epoch,
        "generation_id": -1, "member_id": "", "group_instance_id": None,
        "topics": [{"name": txn_topic, "partitions": [{"partition_index": 0, "committed_offset": 5,
                                                       "committed_leader_epoch": -1, "committed_metadata": ""}]}]},
        lambda b: b.topics[0].partitions[0].error_code)
    assert body.topics[0].partitions[0].error_code == NONE

    def fetch(require_stable: bool) -> list[tuple[int, int]]:
        body = client.call(OFFSET_FETCH, 7, {"group_id": group, "require_stable": require_stable,
                                             "topics": [{"name": txn_topic, "partition_indexes": [0, 1]}]})
        assert body.error_code == NONE
        parts = sorted(body.topics[0].partitions, key=lambda p: p.partition_index)
        return [(p.error_code, p.committed_offset) for p in parts]

    assert fetch(True) == [(UNSTABLE_OFFSET_COMMIT, -1), (NONE, 1)]
    assert fetch(False) == [(NONE, 1), (NONE, 1)]
    assert end_txn(client, tid, pid, epoch, commit=True) == NONE
    assert fetch(True) == [(NONE, 5), (NONE, 1)]
    still_serving(broker)


def test_empty_transactional_id_and_unknown_partitions(broker, client, txn_topic):
    """An empty transactional id is INVALID_REQUEST (42) everywhere (Kafka's coordinator: null
    means idempotent, "" is refused); AddPartitionsToTxn with an unknown topic or partition
    answers UNKNOWN_TOPIC_OR_PARTITION (3) for it and OPERATION_NOT_ATTEMPTED (55) for the rest,
    adding nothing."""
    body = client.call(INIT_PRODUCER_ID, 4, {"transactional_id": "", "transaction_timeout_ms": 60000,
                                             "producer_id": -1, "producer_epoch": -1})
    assert (body.error_code, body.producer_id) == (INVALID_REQUEST, -1)
    assert client.call(END_TXN, 3, {"transactional_id": "", "producer_id": 1, "producer_epoch": 0,
                                    "committed": True}).error_code == INVALID_REQUEST
    body = client.call(ADD_PARTITIONS, 3, {
        "v3_and_below_transactional_id": "", "v3_and_below_producer_id": 1, "v3_and_below_producer_epoch": 0,
        "v3_and_below_topics": [{"name": txn_topic, "partitions": [0]}]})
    assert body.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == INVALID_REQUEST

    tid = unique_name("txn-unknown-partitions")
    pid, epoch = init_txn(client, tid)
    body = client.call(ADD_PARTITIONS, 3, {
        "v3_and_below_transactional_id": tid, "v3_and_below_producer_id": pid,
        "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": txn_topic, "partitions": [0, 99]},
                                {"name": "no-such-topic-" + uuid.uuid4().hex[:6], "partitions": [0]}]})
    got = {(t.name == txn_topic, p.partition_index): p.partition_error_code
           for t in body.results_by_topic_v3_and_below for p in t.results_by_partition}
    assert got == {(True, 0): OPERATION_NOT_ATTEMPTED, (True, 99): UNKNOWN_TOPIC_OR_PARTITION,
                   (False, 0): UNKNOWN_TOPIC_OR_PARTITION}
    state = describe_txn(broker.bootstrap, tid)
    assert (state.transaction_state, list(state.topics)) == ("Empty", [])
    still_serving(broker)


def test_end_txn_retries_after_completion(broker, client, txn_topic):
    """EndTxn repeated after the transaction completed (a retry whose first response was lost)
    answers NONE for the same decision and INVALID_TXN_STATE (48) for the other one."""
    tid = unique_name("txn-end-retry")
    pid, epoch = init_txn(client, tid)
    assert add_partitions(client, tid, pid, epoch, txn_topic, [0]) == [NONE]
    assert produce(client, txn_topic, txn_batch(pid, epoch, 0, b"once"), tid=tid)[0] == NONE
    assert end_txn(client, tid, pid, epoch, commit=True) == NONE
    assert end_txn(client, tid, pid, epoch, commit=True) == NONE
    assert end_txn(client, tid, pid, epoch, commit=False) == INVALID_TXN_STATE
    assert describe_txn(broker.bootstrap, tid).transaction_state == "CompleteCommit"
    assert values(read_to_end(broker.bootstrap, txn_topic, [0], committed=True)[0]) == ["once"]
    assert len(read_to_end(broker.bootstrap, txn_topic, [0], committed=False)[0]) == 1
    assert list_offset(broker.bootstrap, txn_topic, 0, isolation=0) == 2  # one record, one marker
    still_serving(broker)
