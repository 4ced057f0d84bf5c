"""The ACL matrix: for each family of requests, what Kafka's brokers check, request by request.

One table row per family says which request a client makes (through confluent-kafka,
kafka-python, or a raw request where no client can make it without first being told the
topic exists), the ACLs it needs, and the error Kafka answers without them. Every row runs
in four variants, each as a fresh principal that holds no ACL but the ones the test gives it:

- literal: refused without the ACL, the same request succeeds once a literal ALLOW is added;
- prefixed: the same, the ALLOW on a prefix of the resources' names;
- deny: ALLOW and a DENY of the operation the broker checks: refused; without the DENY the
  same request succeeds;
- super: the super user, holding no ACL at all, succeeds.

"Nothing readable or writable without its ACL" is checked on the data, with the super user:
a refused write left the log (topic, offsets, configs, partitions, group) as it was, and a
refused read handed the client nothing (no record, offset, config or group state).

Some rows give a `baseline` ACL first: what a real client needs before it sends the request
under test at all (DESCRIBE on the topic, so that its metadata lookup finds a leader; READ on
the group, which a librdkafka consumer looks up at start), so the refusal seen is the check
under test.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka.admin import KafkaAdminClient

from strom.client import ClientSecurity, Connection
from strom.testing import BrokerProcess, consume_all, unique_name, wait_for

SUPER = "admin"
USERS = [SUPER] + [f"user{i:03d}" for i in range(100)]
JAAS = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
        + " ".join(f'user_{u}="{u}-secret"' for u in USERS) + ";")
TOPIC_AUTH, GROUP_AUTH, CLUSTER_AUTH, TXN_ID_AUTH = 29, 30, 31, 53
LIST_OFFSETS, METADATA, INIT_PRODUCER_ID = 2, 3, 22
KINDS = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
         "txn": ResourceType.TRANSACTIONAL_ID, "cluster": ResourceType.BROKER}  # BROKER: Kafka's CLUSTER
Op = AclOperation


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides={
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "super.users": f"User:{SUPER}",
            "group.initial.rebalance.delay.ms": "0", "auto.create.topics.enable": "false",
            "offsets.topic.num.partitions": "4", "transaction.state.log.num.partitions": "4"}) as b:
        yield b


@pytest.fixture(scope="module")
def fresh_users():
    return iter(USERS[1:])


def conf(broker, user: str) -> dict[str, str]:
    return {"bootstrap.servers": f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN", "sasl.username": user, "sasl.password": f"{user}-secret"}


@dataclass
class Env:
    """One test's principal and resources: `<base>.topic`, `<base>.group`, `<base>.txn`, all
    under the prefix `<base>.`; `seen` is what the principal's reads handed back."""

    broker: BrokerProcess
    admin: AdminClient  # the super user's
    user: str
    base: str
    seen: list = field(default_factory=list)

    @property
    def topic(self) -> str:
        return f"{self.base}.topic"

    @property
    def group(self) -> str:
        return f"{self.base}.group"

    @property
    def txn(self) -> str:
        return f"{self.base}.txn"

    @property
    def prefix(self) -> str:
        return f"{self.base}."

    def conf(self, **extra) -> dict:
        return {**conf(self.broker, self.user), **extra}

    def client(self) -> AdminClient:
        # A new client for every attempt: librdkafka remembers a topic it was refused.
        return AdminClient(self.conf())

    def connect(self) -> Connection:
        return Connection("127.0.0.1", self.broker.ports["SASL_PLAINTEXT"], security=ClientSecurity(
            sasl_mechanism="PLAIN", username=self.user, password=f"{self.user}-secret"))

    def name_of(self, kind: str) -> str:
        return {"topic": self.topic, "group": self.group, "txn": self.txn, "cluster": "kafka-cluster"}[kind]


def code_of(call: Callable[[AdminClient], dict], env: Env) -> int:
    """0 if the admin call (on a new client of the env's principal) succeeds, else the Kafka
    error code it failed with."""
    client = env.client()  # referenced until the futures are done: a dropped client fails them
    try:
        for future in call(client).values():
            future.result(30)
    except KafkaException as e:
        return e.args[0].code()
    return 0


# --- what the super user sees ----------------------------------------------------------------

def make_topic(env: Env, **config: str) -> None:
    env.admin.create_topics([NewTopic(env.topic, 1, 1, config=config)])[env.topic].result(30)


def super_produce(env: Env, *values: bytes) -> None:
    producer = Producer(conf(env.broker, SUPER))
    for value in values:
        producer.produce(env.topic, value=value)
    assert producer.flush(15) == 0


def log_of(env: Env, committed: bool = False) -> list[bytes]:
    """Every record value in the topic's partition 0, read by the super user."""
    isolation = "read_committed" if committed else "read_uncommitted"
    return [m.value() for m in consume_all(env.broker.bootstrap, env.topic, [0], allow_empty=True, timeout=20,
                                           **conf(env.broker, SUPER), **{"isolation.level": isolation})]


def low_watermark(env: Env) -> int:
    consumer = Consumer(conf(env.broker, SUPER) | {"group.id": "watermarks"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(env.topic, 0), timeout=10)[0]
    finally:
        consumer.close()


def topic_partitions(env: Env) -> int | None:
    """The topic's partition count, None if it does not exist."""
    topic = env.admin.list_topics(timeout=10).topics.get(env.topic)
    return None if topic is None else len(topic.partitions)


def topic_config(env: Env, key: str) -> str:
    resource = ConfigResource("topic", env.topic)
    return env.admin.describe_configs([resource])[resource].result(10)[key].value


def committed(env: Env) -> int | None:
    """The group's committed offset of partition 0, None if it has none."""
    wanted = ConsumerGroupTopicPartitions(env.group, [TopicPartition(env.topic, 0)])
    try:
        result = env.admin.list_consumer_group_offsets([wanted])[env.group].result(10)
    except KafkaException as e:
        assert e.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND, e
        return None
    offset = result.topic_partitions[0].offset
    return None if offset < 0 else offset


def super_commit(env: Env, offset: int = 1) -> None:
    """The group exists (empty, with a committed offset), made by the super user."""
    make_topic(env)
    super_produce(env, b"r0", b"r1")
    offsets = ConsumerGroupTopicPartitions(env.group, [TopicPartition(env.topic, 0, offset)])
    env.admin.alter_consumer_group_offsets([offsets])[env.group].result(10)
    assert committed(env) == offset


# --- the attempts: one request (or client action) each, 0 or the error code ---------------------

def produce(env: Env, idempotent: bool = False) -> int:
    errors: list = []
    producer = Producer(env.conf(**{"message.timeout.ms": 5000, "enable.idempotence": idempotent}))
    producer.produce(env.topic, value=f"from-{env.user}".encode(), on_delivery=lambda err, _m: errors.append(err))
    try:
        producer.flush(15)
    except KafkaException as e:  # a fatal error (idempotent producers: no producer id)
        return e.args[0].code()
    except SystemError as e:
        # confluent-kafka raises a fatal error while the purged record's callback runs; the
        # error is the cause.
        cause = e.__cause__
        return (cause.args[0] if isinstance(cause, KafkaException) else cause).code()
    assert len(errors) == 1
    return errors[0].code() if errors[0] is not None else 0


def read(env: Env, subscribe: bool) -> int:
    """A consumer of the group reads the topic (assigned, or subscribed and so a member)."""
    consumer = Consumer(env.conf(**{"group.id": env.group, "enable.auto.commit": False,
                                    "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100}))
    try:
        if subscribe:
            consumer.subscribe([env.topic])
        else:
            consumer.assign([TopicPartition(env.topic, 0, 0)])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                return msg.error().code()
            env.seen.append(msg.value())
            return 0
        return KafkaError._TIMED_OUT
    finally:
        consumer.close()


def list_offsets(env: Env) -> int:
    # Raw: without DESCRIBE the topic is hidden, so a client would not find a leader to ask.
    with env.connect() as conn:
        body = conn.call(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": env.topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                                "timestamp": -1}]}]})
    answer = body.topics[0].partitions[0]
    if answer.error_code == 0:
        env.seen.append(answer.offset)
    return answer.error_code


def metadata(env: Env) -> int:
    """A full listing (confluent-kafka) leaves the topic out; asked for by name (raw), the
    answer is TOPIC_AUTHORIZATION_FAILED."""
    listed = env.client().list_topics(timeout=10).topics
    with env.connect() as conn:
        named = conn.call(METADATA, 9, {"topics": [{"name": env.topic}], "allow_auto_topic_creation": False,
                                        "include_topic_authorized_operations": False}).topics[0]
    if named.error_code == 0 and env.topic in listed:
        env.seen.append((len(named.partitions), len(listed[env.topic].partitions)))
        return 0
    assert env.topic not in listed, "a topic refused by name was listed"
    return named.error_code


def commit_offset(env: Env) -> int:
    offsets = ConsumerGroupTopicPartitions(env.group, [TopicPartition(env.topic, 0, 1)])
    client = env.client()
    try:
        result = client.alter_consumer_group_offsets([offsets])[env.group].result(10)
    except KafkaException as e:
        return e.args[0].code()
    error = result.topic_partitions[0].error
    return error.code() if error else 0


def fetch_offset(env: Env) -> int:
    wanted = ConsumerGroupTopicPartitions(env.group, [TopicPartition(env.topic, 0)])
    client = env.client()
    try:
        result = client.list_consumer_group_offsets([wanted])[env.group].result(10)
    except KafkaException as e:
        return e.args[0].code()
    tp = result.topic_partitions[0]
    if tp.error:
        return tp.error.code()
    env.seen.append(tp.offset)
    return 0


def create_topic(env: Env) -> int:
    return code_of(lambda client: client.create_topics([NewTopic(env.topic, 1, 1)]), env)


def delete_topic(env: Env) -> int:
    return code_of(lambda client: client.delete_topics([env.topic]), env)


def describe_configs(env: Env) -> int:
    resource = ConfigResource("topic", env.topic)
    client = env.client()
    try:
        configs = client.describe_configs([resource])[resource].result(10)
    except KafkaException as e:
        return e.args[0].code()
    env.seen.append(configs["retention.ms"].value)
    return 0


def alter_configs(env: Env) -> int:
    resource = ConfigResource("topic", env.topic, incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])
    return code_of(lambda client: client.incremental_alter_configs([resource]), env)


def create_partitions(env: Env) -> int:
    return code_of(lambda client: client.create_partitions([NewPartitions(env.topic, 2)]), env)


def delete_records(env: Env) -> int:
    return code_of(lambda client: client.delete_records([TopicPartition(env.topic, 0, 2)]), env)


def transaction(env: Env) -> int:
    """init, begin, produce one record, commit."""
    errors: list = []
    producer = Producer(env.conf(**{"transactional.id": env.txn, "message.timeout.ms": 5000}))
    try:
        producer.init_transactions(10)
        producer.begin_transaction()
        producer.produce(env.topic, value=f"txn-{env.user}".encode(), on_delivery=lambda err, _m: errors.append(err))
        producer.commit_transaction(10)
    except KafkaException as e:
        # confluent-kafka never frees a transaction call's exception: without its traceback it
        # keeps no frame alive (this one's, the test's, and through them the module's clients).
        e.__traceback__ = None
        if e.args[0].txn_requires_abort():
            # librdkafka ends a transaction even when no partition was added to it, and the
            # broker answers that as Kafka's does (INVALID_TXN_STATE, a fatal error): the
            # producer is thrown away either way.
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(10)
        # The record's own error says why, unless it was only purged with the transaction.
        failed = [err for err in errors if err is not None and err.code() != KafkaError._PURGE_QUEUE]
        return failed[0].code() if failed else e.args[0].code()
    return 0


def init_producer_id(env: Env) -> int:
    # Raw: a client asks for a producer id only on its way to producing, which needs more ACLs.
    with env.connect() as conn:
        body = conn.call(INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                               "producer_id": -1, "producer_epoch": -1})
    if body.error_code == 0:
        env.seen.append(body.producer_id)
    else:
        assert body.producer_id == -1
    return body.error_code


def describe_group(env: Env) -> int:
    client = env.client()
    try:
        described = client.describe_consumer_groups([env.group])[env.group].result(10)
    except KafkaException as e:
        return e.args[0].code()
    env.seen.append(described.state)
    return 0


def list_groups(env: Env) -> int:
    """kafka-python's ListGroups: groups the principal may not describe are left out (there is
    no error to answer), so "refused" here is GROUP_AUTHORIZATION_FAILED standing for hidden."""
    client = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{env.broker.ports['SASL_PLAINTEXT']}",
                              security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                              sasl_plain_username=env.user, sasl_plain_password=f"{env.user}-secret")
    try:
        names = [g[0] if isinstance(g, tuple) else g["group_id"] for g in client.list_groups()]
    finally:
        client.close()
    if env.group in names:
        env.seen.append(env.group)
        return 0
    return GROUP_AUTH


def delete_group(env: Env) -> int:
    return code_of(lambda client: client.delete_consumer_groups([env.group]), env)


# --- the checks on the data ------------------------------------------------------------------

def nothing_seen(env: Env) -> None:
    assert env.seen == []


def produced_nothing(env: Env) -> None:
    assert log_of(env) == []


def produced_mine(env: Env) -> None:
    assert log_of(env) == [f"from-{env.user}".encode()]


def record_read(env: Env) -> None:
    assert env.seen == [b"secret"]


def no_commit(env: Env) -> None:
    assert committed(env) is None


def topic_absent(env: Env) -> None:
    assert topic_partitions(env) is None


def topic_present(env: Env) -> None:
    assert topic_partitions(env) == 1


def topic_intact(env: Env) -> None:
    assert topic_partitions(env) == 1 and log_of(env) == [b"keep"]


def topic_deleted(env: Env) -> None:
    wait_for(lambda: topic_partitions(env) is None, timeout=15, what=f"{env.topic} to go")


def config_unchanged(env: Env) -> None:
    assert topic_config(env, "retention.ms") == "86400123"


def config_altered(env: Env) -> None:
    assert topic_config(env, "retention.ms") == "7200000"


def records_kept(env: Env) -> None:
    assert low_watermark(env) == 0 and log_of(env) == [b"r0", b"r1", b"r2"]


def records_deleted(env: Env) -> None:
    assert low_watermark(env) == 2 and log_of(env) == [b"r2"]


def txn_wrote_nothing(env: Env) -> None:
    assert log_of(env) == []  # not even an aborted record


def txn_committed(env: Env) -> None:
    assert log_of(env, committed=True) == [f"txn-{env.user}".encode()]


def group_kept(env: Env) -> None:
    assert committed(env) == 1 and env.seen == []


def group_gone(env: Env) -> None:
    assert committed(env) is None


@dataclass(frozen=True)
class Case:
    id: str
    attempt: Callable[[Env], int]
    refused: int  # the error code without the ACLs
    grants: tuple[tuple[str, AclOperation], ...]  # (resource kind, operation) ALLOWs that make it succeed
    deny: tuple[str, AclOperation]  # the operation the broker checks, for the DENY variant
    untouched: Callable[[Env], None]  # after a refusal
    done: Callable[[Env], None]  # after a success
    setup: Callable[[Env], None] = lambda env: None
    baseline: tuple[tuple[str, AclOperation], ...] = ()

    @property
    def cluster_only(self) -> bool:
        return all(kind == "cluster" for kind, _ in self.grants + self.baseline)


CASES = [
    Case("produce", produce, TOPIC_AUTH, (("topic", Op.WRITE),), ("topic", Op.WRITE),
         produced_nothing, produced_mine, setup=make_topic),
    Case("idempotent-produce", lambda env: produce(env, idempotent=True), CLUSTER_AUTH,
         (("topic", Op.WRITE),), ("topic", Op.WRITE), produced_nothing, produced_mine, setup=make_topic,
         baseline=(("topic", Op.DESCRIBE),)),
    Case("idempotent-write-cluster", init_producer_id, CLUSTER_AUTH, (("cluster", Op.IDEMPOTENT_WRITE),),
         ("cluster", Op.IDEMPOTENT_WRITE), nothing_seen, lambda env: assert_producer_id(env)),
    Case("fetch", lambda env: read(env, subscribe=False), TOPIC_AUTH, (("topic", Op.READ),), ("topic", Op.READ),
         nothing_seen, record_read, setup=lambda env: (make_topic(env), super_produce(env, b"secret")),
         baseline=(("group", Op.READ), ("topic", Op.DESCRIBE))),
    Case("consume-in-group", lambda env: read(env, subscribe=True), GROUP_AUTH, (("group", Op.READ),),
         ("group", Op.READ), nothing_seen, record_read,
         setup=lambda env: (make_topic(env), super_produce(env, b"secret")), baseline=(("topic", Op.READ),)),
    Case("list-offsets", list_offsets, TOPIC_AUTH, (("topic", Op.DESCRIBE),), ("topic", Op.DESCRIBE),
         nothing_seen, lambda env: assert_seen(env, [2]),
         setup=lambda env: (make_topic(env), super_produce(env, b"a", b"b"))),
    Case("metadata", metadata, TOPIC_AUTH, (("topic", Op.DESCRIBE),), ("topic", Op.DESCRIBE),
         nothing_seen, lambda env: assert_seen(env, [(1, 1)]), setup=make_topic),
    Case("offset-commit-group", commit_offset, GROUP_AUTH, (("group", Op.READ),), ("group", Op.READ),
         no_commit, lambda env: assert_committed(env, 1),
         setup=lambda env: (make_topic(env), super_produce(env, b"a", b"b")), baseline=(("topic", Op.READ),)),
    Case("offset-commit-topic", commit_offset, TOPIC_AUTH, (("topic", Op.READ),), ("topic", Op.READ),
         no_commit, lambda env: assert_committed(env, 1),
         setup=lambda env: (make_topic(env), super_produce(env, b"a", b"b")), baseline=(("group", Op.READ),)),
    Case("offset-fetch-group", fetch_offset, GROUP_AUTH, (("group", Op.READ),), ("group", Op.DESCRIBE),
         nothing_seen, lambda env: assert_seen(env, [1]), setup=super_commit, baseline=(("topic", Op.READ),)),
    Case("offset-fetch-topic", fetch_offset, TOPIC_AUTH, (("topic", Op.READ),), ("topic", Op.DESCRIBE),
         nothing_seen, lambda env: assert_seen(env, [1]), setup=super_commit, baseline=(("group", Op.READ),)),
    Case("create-topic", create_topic, TOPIC_AUTH, (("topic", Op.CREATE),), ("topic", Op.CREATE),
         topic_absent, topic_present),
    Case("create-topic-on-cluster", create_topic, TOPIC_AUTH, (("cluster", Op.CREATE),), ("cluster", Op.CREATE),
         topic_absent, topic_present),
    Case("delete-topic", delete_topic, TOPIC_AUTH, (("topic", Op.DELETE),), ("topic", Op.DELETE),
         topic_intact, topic_deleted, setup=lambda env: (make_topic(env), super_produce(env, b"keep"))),
    Case("describe-configs", describe_configs, TOPIC_AUTH, (("topic", Op.DESCRIBE_CONFIGS),),
         ("topic", Op.DESCRIBE_CONFIGS), nothing_seen, lambda env: assert_seen(env, ["86400123"]),
         setup=lambda env: make_topic(env, **{"retention.ms": "86400123"})),
    Case("alter-configs", alter_configs, TOPIC_AUTH, (("topic", Op.ALTER_CONFIGS),), ("topic", Op.ALTER_CONFIGS),
         config_unchanged, config_altered, setup=lambda env: make_topic(env, **{"retention.ms": "86400123"})),
    Case("create-partitions", create_partitions, TOPIC_AUTH, (("topic", Op.ALTER),), ("topic", Op.ALTER),
         topic_present, lambda env: assert_partitions(env, 2), setup=make_topic),
    Case("delete-records", delete_records, TOPIC_AUTH, (("topic", Op.DELETE),), ("topic", Op.DELETE),
         records_kept, records_deleted, setup=lambda env: (make_topic(env), super_produce(env, b"r0", b"r1", b"r2")),
         baseline=(("topic", Op.DESCRIBE),)),
    Case("transaction-id", transaction, TXN_ID_AUTH, (("txn", Op.WRITE), ("topic", Op.WRITE)), ("txn", Op.WRITE),
         txn_wrote_nothing, txn_committed, setup=make_topic),
    Case("transaction-topic", transaction, TOPIC_AUTH, (("topic", Op.WRITE),), ("topic", Op.WRITE),
         txn_wrote_nothing, txn_committed, setup=make_topic, baseline=(("txn", Op.WRITE),)),
    Case("describe-group", describe_group, GROUP_AUTH, (("group", Op.DESCRIBE),), ("group", Op.DESCRIBE),
         nothing_seen, lambda env: assert_seen(env, [ConsumerGroupState.EMPTY]), setup=super_commit),
    Case("list-groups", list_groups, GROUP_AUTH, (("group", Op.DESCRIBE),), ("group", Op.DESCRIBE),
         nothing_seen, lambda env: assert_seen(env, [env.group]), setup=super_commit),
    Case("delete-group", delete_group, GROUP_AUTH, (("group", Op.DELETE),), ("group", Op.DELETE),
         group_kept, group_gone, setup=super_commit),
]


def assert_seen(env: Env, expected: list) -> None:
    assert env.seen == expected


def assert_committed(env: Env, offset: int) -> None:
    assert committed(env) == offset


def assert_partitions(env: Env, count: int) -> None:
    assert topic_partitions(env) == count


def assert_producer_id(env: Env) -> None:
    assert len(env.seen) == 1 and env.seen[0] >= 0


VARIANTS = ("literal", "prefixed", "deny", "super")
MATRIX = [pytest.param(case, variant, id=f"{case.id}-{variant}")
          for case, variant in itertools.product(CASES, VARIANTS)
          if not (variant == "prefixed" and case.cluster_only)]  # the cluster has no prefixes


def bindings(env: Env, wanted, permission=AclPermissionType.ALLOW, prefixed: bool = False) -> list[AclBinding]:
    out = []
    for kind, operation in wanted:
        if prefixed and kind != "cluster":
            name, pattern = env.prefix, ResourcePatternType.PREFIXED
        else:
            name, pattern = env.name_of(kind), ResourcePatternType.LITERAL
        out.append(AclBinding(KINDS[kind], name, pattern, f"User:{env.user}", "*", operation, permission))
    return out


def add_acls(env: Env, acls: list[AclBinding]) -> None:
    if not acls:
        return
    for future in env.admin.create_acls(acls).values():
        future.result(10)


def remove_acls(env: Env, acls: list[AclBinding]) -> None:
    filters = [AclBindingFilter(a.restype, a.name, a.resource_pattern_type, a.principal, a.host, a.operation,
                                a.permission_type) for a in acls]
    for future in env.admin.delete_acls(filters).values():
        assert len(future.result(10)) == 1


@pytest.fixture(scope="module")
def super_admin(broker):
    return AdminClient(conf(broker, SUPER))


@pytest.mark.parametrize(("case", "variant"), MATRIX)
def test_acl_matrix(broker, super_admin, fresh_users, case: Case, variant: str):
    env = Env(broker, super_admin, SUPER if variant == "super" else next(fresh_users),
              unique_name(f"m-{case.id}-{variant}"))
    case.setup(env)
    if variant == "super":  # no ACL at all
        assert case.attempt(env) == 0
        case.done(env)
        return
    add_acls(env, bindings(env, case.baseline, prefixed=variant == "prefixed"))
    if variant == "deny":
        add_acls(env, bindings(env, case.grants))
        deny = bindings(env, [case.deny], AclPermissionType.DENY)
        add_acls(env, deny)
    assert case.attempt(env) == case.refused
    case.untouched(env)
    if variant == "deny":
        remove_acls(env, deny)
    else:
        add_acls(env, bindings(env, case.grants, prefixed=variant == "prefixed"))
    assert case.attempt(env) == 0
    case.done(env)


@pytest.mark.parametrize(("deny_name", "deny_pattern", "refused"), [
    pytest.param("{topic}", ResourcePatternType.LITERAL, True, id="literal-deny-of-the-allowed-topic"),
    pytest.param("{base}.", ResourcePatternType.PREFIXED, True, id="prefixed-deny-covering-it"),
    pytest.param("*", ResourcePatternType.LITERAL, True, id="wildcard-deny"),
    pytest.param("{base}.other", ResourcePatternType.LITERAL, False, id="deny-of-another-topic"),
    pytest.param("{base}.topicx", ResourcePatternType.PREFIXED, False, id="deny-of-a-longer-prefix"),
])
def test_idempotent_write_by_topic_respects_denies(broker, super_admin, fresh_users, deny_name, deny_pattern, refused):
    """An idempotent producer without IDEMPOTENT_WRITE on the cluster needs WRITE on some topic
    (Kafka's authorizeByResourceType): an ALLOW that a DENY overrides does not count."""
    env = Env(broker, super_admin, next(fresh_users), unique_name("m-idempotent-denies"))
    add_acls(env, bindings(env, [("topic", Op.WRITE)]))
    assert init_producer_id(env) == 0
    name = deny_name.format(topic=env.topic, base=env.base)
    add_acls(env, [AclBinding(ResourceType.TOPIC, name, deny_pattern, f"User:{env.user}", "*", Op.WRITE,
                              AclPermissionType.DENY)])
    assert init_producer_id(env) == (CLUSTER_AUTH if refused else 0)
