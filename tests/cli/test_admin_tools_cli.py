"""Kafka's admin tools as `strom` commands, run as subprocesses: leader-election and log-dirs
against a 2-broker ZooKeeper cluster (a leader to move, log dirs on two brokers), the others
(delete-records, broker-api-versions, features, cluster cluster-id, transactions) against the
shared CLI broker, and cluster unregister against a KRaft controller with one broker."""

from __future__ import annotations

import json
import re
import time

import pytest

from strom.testing import Cluster, KRaftQuorum, unique_name

from .conftest import fails, ok, strom

pytestmark = pytest.mark.timeout(120)  # a hang guard


def _leaders(bootstrap: str, topic: str) -> dict[int, tuple[str, str]]:
    """partition -> (leader, isr) from `strom topics describe`."""
    out = {}
    for line in ok("topics", "describe", "--topic", topic, "--bootstrap-server", bootstrap).splitlines():
        if line.startswith("\tTopic: "):
            fields = dict(part.split(": ", 1) for part in line.strip("\t").split("\t"))
            out[int(fields["Partition"])] = (fields["Leader"], fields["Isr"])
    return out


def _wait(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def cluster():
    with Cluster(2, overrides={"auto.leader.rebalance.enable": "false"}) as c:
        yield c


def test_log_dirs_and_leader_election_on_two_brokers(cluster, tmp_path):
    bootstrap = cluster.bootstrap
    topic = unique_name("elect")
    ok("topics", "create", topic, "--replica-assignment", "1:2,2:1", "--bootstrap-server", bootstrap)
    ok("produce", "--topic", topic, "--bootstrap-server", bootstrap, input="a\nb\nc\n", allow_stderr=True)

    progress, received, document = ok("log-dirs", "--describe", "--topic-list", topic,
                                      "--bootstrap-server", bootstrap).splitlines()
    assert progress == "Querying brokers for log directories information"
    assert received == "Received log directory information from brokers 1,2"
    assert document.startswith('{"brokers":[{"broker":1,"logDirs":[{"partitions":[')  # Kafka's key order
    described = json.loads(document)
    assert described["version"] == 1 and [b["broker"] for b in described["brokers"]] == [1, 2]
    for broker in described["brokers"]:
        (log_dir,) = broker["logDirs"]
        assert log_dir["error"] is None and log_dir["logDir"].startswith("/")
        assert [p["partition"] for p in log_dir["partitions"]] == [f"{topic}-0", f"{topic}-1"]
        assert list(log_dir["partitions"][0]) == ["partition", "size", "offsetLag", "isFuture"]
    assert sum(p["size"] for p in described["brokers"][0]["logDirs"][0]["partitions"]) > 0
    only_two = json.loads(ok("log-dirs", "--describe", "--broker-list", "2", "--topic-list", topic,
                             "--bootstrap-server", bootstrap).splitlines()[-1])
    assert [b["broker"] for b in only_two["brokers"]] == [2]
    assert fails("log-dirs", "--describe", "--broker-list", "2,7", "--bootstrap-server", bootstrap) == (
        "Error: The given brokers do not exist from --broker-list: 7. Current existent brokers: 1,2")
    assert fails("log-dirs", "--bootstrap-server", bootstrap, code=2) == "Error: Missing option '--describe'."

    # The preferred leaders lead already: nothing to do.
    assert ok("leader-election", "--election-type", "PREFERRED", "--topic", topic, "--partition", "0",
              "--bootstrap-server", bootstrap) == f"Valid replica already elected for partitions {topic}-0\n"

    # Broker 1 goes away and comes back: broker 2 leads both partitions until an election.
    cluster.brokers[1].stop()
    _wait(lambda: _leaders(cluster.bootstrap, topic) == {0: ("2", "2"), 1: ("2", "2")}, "broker 2 to lead")
    cluster.brokers[1].start()
    _wait(lambda: all(isr in ("2,1", "1,2") for _, isr in _leaders(bootstrap, topic).values()), "broker 1 in the ISR")
    assert _leaders(bootstrap, topic)[0][0] == "2"
    spec = tmp_path / "partitions.json"
    spec.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0}, {"topic": topic, "partition": 1}]}))
    assert ok("leader-election", "--election-type", "preferred", "--path-to-json-file", str(spec),
              "--bootstrap-server", bootstrap).splitlines() == [
        f"Successfully completed leader election (PREFERRED) for partitions {topic}-0",
        f"Valid replica already elected for partitions {topic}-1"]
    assert _leaders(bootstrap, topic)[0][0] == "1"

    missing = strom("leader-election", "--election-type", "PREFERRED", "--topic", "no-such-topic", "--partition", "0",
                    "--bootstrap-server", bootstrap)
    assert missing.returncode == 1
    assert missing.stdout.startswith("Error completing leader election (PREFERRED) for partition: no-such-topic-0: ")
    assert missing.stderr.strip() == "Error: 1 replica(s) could not be elected"
    spec.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0}, {"topic": topic, "partition": 0}]}))
    assert fails("leader-election", "--election-type", "PREFERRED", "--path-to-json-file", str(spec),
                 "--bootstrap-server", bootstrap) == (
        f"Error: Replica election data contains duplicate partitions: {topic}-0")
    assert "One and only one of the following options is required" in fails(
        "leader-election", "--election-type", "PREFERRED", "--all-topic-partitions", "--topic", topic,
        "--partition", "0", code=2)
    assert fails("leader-election", "--election-type", "UNCLEAN", "--topic", topic, code=2) == (
        "Error: Missing required option(s): --partition")


def test_delete_records(cli_broker, tmp_path):
    bootstrap = cli_broker.bootstrap
    topic = unique_name("delete-records")
    ok("topics", "create", topic, "--partitions", "1", "--bootstrap-server", bootstrap)
    ok("produce", "--topic", topic, "--bootstrap-server", bootstrap, input="1\n2\n3\n4\n5\n", allow_stderr=True)
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "offset": 3}]}))
    assert ok("delete-records", "--offset-json-file", str(offsets), "--bootstrap-server", bootstrap) == (
        "Executing records delete operation\nRecords delete operation completed:\n"
        f"partition: {topic}-0\tlow_watermark: 3\n")
    assert ok("get-offsets", "--topic", topic, "--time", "earliest", "--bootstrap-server", bootstrap) == f"{topic}:0:3\n"

    # -1: everything below the high watermark; a partition that does not exist fails on its own line.
    offsets.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0, "offset": -1},
                                                  {"topic": topic, "partition": 9, "offset": 1}]}))
    done = strom("delete-records", "--offset-json-file", str(offsets), "--bootstrap-server", bootstrap)
    assert done.returncode == 1, done
    assert done.stdout.splitlines()[2:] == [f"partition: {topic}-0\tlow_watermark: 5",
                                            f"partition: {topic}-9\terror: UNKNOWN_TOPIC_OR_PARTITION: "
                                            "This request is for a topic or partition that does not exist on this broker."]
    assert done.stderr.strip() == f"Error: deleting records failed for {topic}-9"

    offsets.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0, "offset": 1}] * 2}))
    assert fails("delete-records", "--offset-json-file", str(offsets), "--bootstrap-server", bootstrap) == (
        f"Error: Offset json file contains duplicate topic partitions: {topic}-0")
    offsets.write_text('{"version": 2, "partitions": []}')
    assert "Not supported version field value 2" in fails("delete-records", "--offset-json-file", str(offsets),
                                                         "--bootstrap-server", bootstrap)
    offsets.write_text("{not json")
    assert "is not valid JSON" in fails("delete-records", "--offset-json-file", str(offsets))
    offsets.write_text("[" * 100_000)
    assert fails("delete-records", "--offset-json-file", str(offsets)) == f"Error: {offsets}: JSON nested too deeply"
    offsets.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0, "offset": 2**63}]}))
    assert f'"offset" of {topic}-0 must be an offset' in fails("delete-records", "--offset-json-file", str(offsets))


def test_broker_api_versions_features_and_cluster_id(cli_broker):
    bootstrap = cli_broker.bootstrap
    lines = ok("broker-api-versions", "--bootstrap-server", bootstrap).splitlines()
    host, port = bootstrap.split(":")
    assert lines[0] == f"{host}:{port} (id: 0 rack: null) -> ("
    assert lines[-1] == ")"
    apis = lines[1:-1]
    assert all(re.fullmatch(r"\t\w+\(\d+\): (\d+( to \d+)? \[(usable: \d+|unusable: node too (old|new))\]"
                            r"|UNSUPPORTED),?", line) for line in apis), apis
    assert "\tApiVersions(18): 0 to 4 [usable: 4]," in apis
    keys = [int(re.search(r"\((\d+)\)", line).group(1)) for line in apis]
    assert keys == sorted(keys) and not apis[-1].endswith(",")

    features = {line.split("\t")[0]: line for line in ok("features", "--bootstrap-server", bootstrap, "describe").splitlines()}
    assert features["Feature: metadata.version"] == (
        "Feature: metadata.version\tSupportedMinVersion: 3.3-IV3\tSupportedMaxVersion: 4.0-IV3\t"
        "FinalizedVersionLevel: 4.0-IV3\tEpoch: 0")
    assert re.fullmatch(r"Feature: transaction.version\tSupportedMinVersion: 0\tSupportedMaxVersion: 2\t"
                        r"FinalizedVersionLevel: \d\tEpoch: \d+", features["Feature: transaction.version"])
    assert ok("features", "upgrade", "--feature", "transaction.version=2", "--dry-run",
              "--bootstrap-server", bootstrap) == "transaction.version can be upgraded to 2.\n"
    assert fails("features", "upgrade", "--feature", "no.such.feature=1", "--bootstrap-server", bootstrap) == (
        "Error: 1 out of 1 operation(s) failed.")
    assert "unknown metadata.version" in fails("features", "upgrade", "--metadata", "9.9-IV9", code=2)

    # version-mapping and feature-dependencies, as kafka-features prints them: the newest release
    # maps to the levels this broker finalized when it formatted its storage.
    finalized = {name.removeprefix("Feature: "): line.split("FinalizedVersionLevel: ")[1].split("\t")[0]
                 for name, line in features.items()}
    latest = ok("features", "--bootstrap-server", bootstrap, "version-mapping").splitlines()
    assert latest[0] == "metadata.version=25 (4.0-IV3)"
    assert dict(line.split("=") for line in latest[1:]) == {k: v for k, v in finalized.items() if k != "metadata.version"}
    assert [line.split("=")[0] for line in latest[1:3]] == ["transaction.version", "group.version"]  # Kafka's order
    older = ok("features", "version-mapping", "--release-version", "3.9").splitlines()
    assert older[0] == "metadata.version=21 (3.9)" and "transaction.version=0" in older and "group.version=0" in older
    assert fails("features", "version-mapping", "--release-version", "3.2") == (
        "Error: Unknown release version '3.2'. Supported versions are: 3.3-IV3 to 4.0-IV3")
    assert ok("features", "feature-dependencies", "--feature", "transaction.version=2",
              "--feature", "metadata.version=25") == ("transaction.version=2 has no dependencies.\n"
                                                      "metadata.version=25 (4.0-IV3) has no dependencies.\n")
    assert fails("features", "feature-dependencies", "--feature", "no.such.feature=1") == (
        "Error: Unknown feature: no.such.feature")
    assert fails("features", "feature-dependencies", "--feature", "metadata.version=99") == (
        "Error: Unknown metadata.version 99")

    cluster_id = ok("cluster", "cluster-id", "--bootstrap-server", bootstrap)
    assert re.fullmatch(r"Cluster ID: [\w-]{22}\n", cluster_id)
    meta = (cli_broker.data_dir / "logs" / "meta.properties").read_text()
    assert f"cluster.id={cluster_id.split()[-1]}" in meta  # the id the broker keeps on disk
    # A ZooKeeper-mode broker, as Kafka's, has no broker registrations to remove.
    assert fails("cluster", "unregister", "--id", "3", "--bootstrap-server", bootstrap) == (
        "Error: The target cluster does not support the broker unregistration API.")


def _table(text: str) -> list[list[str]]:
    """Kafka's transactions table: tab-terminated cells padded to their column's width."""
    lines = text.splitlines()
    assert all(line.endswith("\t") for line in lines), lines
    return [[cell.strip() for cell in line.split("\t")[:-1]] for line in lines]


def test_transactions_list_describe_find_hanging_abort(cli_broker):
    from confluent_kafka import Producer

    bootstrap = cli_broker.bootstrap
    topic, txn_id = unique_name("txn-tool"), unique_name("txn-tool-id")
    ok("topics", "create", topic, "--partitions", "1", "--bootstrap-server", bootstrap)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": 60000})
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0)
    producer.flush()

    # Kafka's tool takes the connection options before the subcommand.
    listed = _table(ok("transactions", "--bootstrap-server", bootstrap, "list"))
    assert listed[0] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    (mine,) = [row for row in listed[1:] if row[0] == txn_id]
    assert mine[1] == "0" and mine[3] == "Ongoing"
    long_running = _table(ok("transactions", "--bootstrap-server", bootstrap, "list", "--duration-filter", "3600000"))
    assert txn_id not in [row[0] for row in long_running[1:]]  # begun just now
    by_pattern = _table(ok("transactions", "--bootstrap-server", bootstrap, "list",
                           "--transactional-id-pattern", re.escape(txn_id)))
    assert [row[0] for row in by_pattern[1:]] == [txn_id]
    prefix_only = re.escape(txn_id[:-3])  # matches a prefix, not the whole id
    assert _table(ok("transactions", "list", "--transactional-id-pattern", prefix_only,
                     "--bootstrap-server", bootstrap))[1:] == []
    assert "INVALID_REGULAR_EXPRESSION" in fails("transactions", "list", "--transactional-id-pattern", "(",
                                                 "--bootstrap-server", bootstrap)
    header, row = _table(ok("transactions", "describe", "--transactional-id", txn_id, "--bootstrap-server", bootstrap))
    described = dict(zip(header, row, strict=True))
    assert (described["TransactionalId"], described["ProducerId"], described["TransactionState"],
            described["TransactionTimeoutMs"], described["TopicPartitions"]) == (txn_id, mine[2], "Ongoing", "60000",
                                                                                  f"{topic}-0")
    header, row = _table(ok("transactions", "--bootstrap-server", bootstrap, "describe-producers", "--topic", topic,
                            "--partition", "0"))
    producer_state = dict(zip(header, row, strict=True))
    assert (producer_state["ProducerId"], producer_state["CurrentTransactionStartOffset"]) == (mine[2], "0")
    # Open, but its coordinator counts the partition in it: not hanging.
    assert _table(ok("transactions", "--bootstrap-server", bootstrap, "find-hanging", "--topic", topic,
                     "--max-transaction-timeout", "0"))[1:] == []
    assert "--topic or --broker-id" in fails("transactions", "find-hanging", code=2)

    assert ok("get-offsets", "--topic", topic, "--isolation-level", "read_committed",
              "--bootstrap-server", bootstrap) == f"{topic}:0:0\n"
    assert ok("transactions", "--bootstrap-server", bootstrap, "abort", "--topic", topic, "--partition", "0",
              "--start-offset", "0") == ""
    # The abort marker ends the transaction on the partition: read_committed readers move on.
    assert ok("get-offsets", "--topic", topic, "--isolation-level", "read_committed",
              "--bootstrap-server", bootstrap) == f"{topic}:0:2\n"
    assert fails("transactions", "--bootstrap-server", bootstrap, "abort", "--topic", topic, "--partition", "0",
                 "--start-offset", "0") == (
        f"Error: Could not find any open transactions starting at offset 0 on partition {topic}-0")
    assert "TRANSACTIONAL_ID_NOT_FOUND" in fails("transactions", "describe", "--transactional-id", unique_name("none"),
                                                 "--bootstrap-server", bootstrap)
    producer.abort_transaction()


def test_unregister_a_retired_broker_at_the_controller():
    with KRaftQuorum(1, brokers=1) as quorum:
        controllers, (broker_id,) = quorum.bootstrap_controllers, list(quorum.brokers)
        broker = quorum.brokers[broker_id]
        by_broker = ok("cluster", "cluster-id", "--bootstrap-server", broker.bootstrap)
        assert ok("cluster", "cluster-id", "--bootstrap-controller", controllers) == by_broker
        assert fails("cluster", "unregister", "--id", "7", "--bootstrap-controller", controllers) == (
            "Error: unregistering broker 7 failed: BROKER_ID_NOT_REGISTERED: Broker 7 is not registered.")
        assert "give one of" in fails("cluster", "unregister", "--id", "7", "--bootstrap-controller", controllers,
                                      "--bootstrap-server", broker.bootstrap, code=2)
        broker.stop()
        assert ok("cluster", "unregister", "--id", str(broker_id), "--bootstrap-controller", controllers) == (
            f"Broker {broker_id} is no longer registered.\n")
        assert "is not registered" in fails("cluster", "unregister", "--id", str(broker_id),
                                            "--bootstrap-controller", controllers)


# --- producer-perf-test and consumer-perf-test ---------------------------------------------------
NUM = r"\d+\.\d"
PRODUCER_TOTAL = re.compile(rf"(\d+) records sent, {NUM} records/sec \({NUM}\d MB/sec\), {NUM}\d ms avg latency, "
                            rf"{NUM}\d ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99.9th\.")
PERF_HEADER = ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
               "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
DATE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{3}"
FOUR = r"-?(?:\d+\.\d{4}|Infinity|NaN)"
CONSUMER_VALUES = re.compile(rf"({DATE}), ({DATE}), ({FOUR}), {FOUR}, (\d+), {FOUR}, (\d+), (-?\d+), {FOUR}, {FOUR}")


def _offsets_total(bootstrap: str, topic: str, *extra: str) -> int:
    lines = ok("get-offsets", "--topic", topic, *extra, "--bootstrap-server", bootstrap).splitlines()
    return sum(int(line.rsplit(":", 1)[1]) for line in lines)


def _consumer_values(stdout: str) -> re.Match:
    header, values = stdout.splitlines()[-2:]
    assert header == PERF_HEADER, stdout
    match = CONSUMER_VALUES.fullmatch(values)
    assert match, values
    return match


def test_producer_and_consumer_perf_test(cli_broker):
    bootstrap = cli_broker.bootstrap
    topic = unique_name("perf")
    ok("topics", "create", topic, "--partitions", "2", "--bootstrap-server", bootstrap)
    (total,) = ok("producer-perf-test", "--topic", topic, "--num-records", "2000", "--record-size", "100",
                  "--throughput", "-1", "--bootstrap-server", bootstrap).splitlines()
    sent = PRODUCER_TOTAL.fullmatch(total)
    assert sent and sent.group(1) == "2000", total
    p50, p95, p99, p999 = (int(sent.group(i)) for i in range(2, 6))
    assert p50 <= p95 <= p99 <= p999
    assert _offsets_total(bootstrap, topic) == 2000

    values = _consumer_values(ok("consumer-perf-test", "--topic", topic, "--messages", "2000",
                                 "--bootstrap-server", bootstrap))
    start, end, mb, count = values.group(1), values.group(2), values.group(3), values.group(4)
    assert start <= end and count == "2000"
    assert mb == "0.1907"  # 2000 values of 100 bytes, in MiB with Kafka's four decimals

    # Asked for one more than the topic holds: all 2000, then Kafka's warning when none come.
    done = ok("consumer-perf-test", "--topic", topic, "--messages", "2001", "--timeout", "2000", "--hide-header",
              "--bootstrap-server", bootstrap)
    warning, line = done.splitlines()
    assert warning == ("WARNING: Exiting before consuming the expected number of messages: timeout (2000 ms) exceeded. "
                       "You can use the --timeout option to increase the timeout.")
    assert CONSUMER_VALUES.fullmatch(line).group(4) == "2000"

    # A group that committed its offsets starts where it left off; detailed stats print
    # progress lines (time, thread 0, totals so far) and no summary.
    group = unique_name("perf-group")
    ok("consumer-perf-test", "--topic", topic, "--messages", "1500", "--group", group, "--bootstrap-server", bootstrap)
    detailed = ok("consumer-perf-test", "--topic", topic, "--messages", "500", "--group", group, "--timeout", "2000",
                  "--show-detailed-stats", "--reporting-interval", "1", "--bootstrap-server", bootstrap).splitlines()
    assert detailed[0] == "time, threadId, " + PERF_HEADER.split(", ", 2)[2]
    progress = [re.fullmatch(rf"({DATE}), 0, {FOUR}, {FOUR}, (\d+), {FOUR}, \d+, -?\d+, {FOUR}, {FOUR}", line)
                for line in detailed[1:]]
    assert progress and all(progress), detailed
    assert int(progress[-1].group(2)) == 500


def test_producer_perf_test_payload_file_throttle_transactions_and_kafka_python(cli_broker, tmp_path):
    bootstrap = cli_broker.bootstrap
    topic = unique_name("perf-payloads")
    ok("topics", "create", topic, "--partitions", "1", "--bootstrap-server", bootstrap)
    payloads = tmp_path / "payloads.txt"
    payloads.write_text("alpha\nbeta\ngamma\n")
    # Throttled to 1000/s, through kafka-python, the bootstrap server among the producer props.
    lines = ok("producer-perf-test", "--topic", topic, "--num-records", "300", "--payload-file", str(payloads),
               "--throughput", "1000", "--client", "kafka-python", "--producer-props",
               f"bootstrap.servers={bootstrap}", "acks=1").splitlines()
    assert lines[:2] == [f"Reading payloads from: {payloads}", "Number of messages read: 3"]
    assert PRODUCER_TOTAL.fullmatch(lines[2]).group(1) == "300"
    values = ok("consume", "--topic", topic, "--from-beginning", "--exit-at-end",
                "--bootstrap-server", bootstrap, allow_stderr=True).splitlines()
    assert len(values) == 300 and set(values) == {"alpha", "beta", "gamma"}  # each record is a line of the file

    # Transactional (committed every 50 ms and at the end), with the client's metrics after the summary.
    txn_topic = unique_name("perf-txn")
    ok("topics", "create", txn_topic, "--partitions", "1", "--bootstrap-server", bootstrap)
    out = ok("producer-perf-test", "--topic", txn_topic, "--num-records", "400", "--record-size", "10",
             "--throughput", "2000", "--transactional-id", unique_name("perf-txn-id"), "--transaction-duration-ms",
             "50", "--print-metrics", "--bootstrap-server", bootstrap).splitlines()
    assert PRODUCER_TOTAL.fullmatch(out[0]).group(1) == "400"
    assert out[1] == "" and re.fullmatch(r"Metric Name +Value", out[2])
    assert all(re.fullmatch(r"\S+:\S+:\{[^}]*\} +: \S+", line) for line in out[3:]) and len(out) > 10
    # The commit markers are written after the commit returns (as in Kafka): past them, the
    # last stable offset covers every record and the markers.
    _wait(lambda: _offsets_total(bootstrap, txn_topic, "--isolation-level", "read_committed") > 400,
          "the last transaction's commit marker")
    read_committed = ok("consumer-perf-test", "--topic", txn_topic, "--messages", "400", "--client", "kafka-python",
                        "--command-property", "isolation.level=read_committed", "--bootstrap-server", bootstrap)
    assert _consumer_values(read_committed).group(4) == "400"


def test_perf_test_bad_input(cli_broker, tmp_path):
    bootstrap = cli_broker.bootstrap
    payloads = tmp_path / "empty.txt"
    payloads.write_text("")
    base = ["--num-records", "10", "--throughput", "-1", "--bootstrap-server", bootstrap]
    assert fails("producer-perf-test", "--record-size", "10", *base) == (
        "producer-performance: error: argument --topic is required")
    assert fails("producer-perf-test", "--topic", "t", "--record-size", "10", "--payload-file", str(payloads),
                 *base) == "producer-performance: error: argument --payload-file: not allowed with argument --record-size"
    assert fails("producer-perf-test", "--topic", "t", *base) == (
        "producer-performance: error: one of the arguments --record-size --payload-file --payload-monotonic is required")
    assert fails("producer-perf-test", "--topic", "t", "--record-size", "0", *base) == (
        "producer-performance: error: --record-size should be greater than zero")
    assert fails("producer-perf-test", "--topic", "t", "--payload-file", str(payloads), *base) == (
        "Error: File does not exist or empty file provided.")
    assert fails("producer-perf-test", "--topic", "t", "--record-size", "10", *base, "--producer-props", "acks") == (
        "Error: Invalid property: acks")
    assert fails("producer-perf-test", "--topic", "bad topic!", "--record-size", "10", *base, "--producer-props",
                 "max.block.ms=500") == "Error: Topic bad topic! not present in metadata after 500 ms."
    # Records the client refuses (larger than message.max.bytes) are counted out, and the run fails.
    too_large = strom("producer-perf-test", "--topic", unique_name("perf-large"), "--record-size", "2000000",
                      "--num-records", "3", "--throughput", "-1", "--bootstrap-server", bootstrap)
    assert too_large.returncode == 1, too_large
    assert too_large.stdout.startswith("0 records sent, 0.0 records/sec (0.00 MB/sec), NaN ms avg latency")
    assert too_large.stderr.splitlines()[-1] == "Error: 3 of 3 records were not sent"
    assert fails("consumer-perf-test", "--topic", "t", "--bootstrap-server", bootstrap) == (
        'Error: Missing required argument "[messages]"')
    assert fails("consumer-perf-test", "--topic", "t", "--messages", "1", "--date-format", "yyyy-qq") == (
        "Error: Illegal pattern character 'q'")
    assert fails("consumer-perf-test", "--topic", "t", "--messages", "1", "--reporting-interval", "0") == (
        "Error: Reporting interval must be greater than 0.")


def test_perf_test_numbers_as_kafka_prints_them(capsys):
    from strom.cli.perf_format import java_date_format, java_fixed, ratio
    from strom.cli.perf_test import ProducerStats, ThroughputThrottler

    # Java's %.Nf rounds half up from the shortest decimal; division by zero is not an error.
    assert [java_fixed(x, 2) for x in (0.125, 1.005, 2.0, -0.5)] == ["0.13", "1.01", "2.00", "-0.50"]
    assert (java_fixed(ratio(1.0, 0), 4), java_fixed(ratio(0.0, 0), 4)) == ("Infinity", "NaN")
    assert java_date_format("yyyy-MM-dd'T'HH:mm:ss:SSS EEE MMM")(0).startswith("1970-01-0")

    # A progress line per reporting interval, in Kafka's words.
    stats = ProducerStats(3, reporting_interval_ms=0)
    stats.record(4, 100, stats.window_start)
    assert re.fullmatch(r"1 records sent, (\d+\.\d|Infinity) records/sec \((\d+\.\d\d|Infinity) MB/sec\), "
                        r"4\.0 ms avg latency, 4\.0 ms max latency\.\n", capsys.readouterr().out)

    # The throttler on a clock that moves by 10 µs a send and by its sleeps: the sends of the
    # first millisecond go unthrottled (Kafka's rate is per whole ms elapsed), each of the
    # other 900 waits 1/500 s.
    clock = {"ms": 0.0}
    throttler = ThroughputThrottler(500, 0)

    def pause(seconds: float) -> None:
        clock["ms"] += seconds * 1000

    for i in range(1000):
        clock["ms"] += 0.01  # each send takes 10 µs
        if throttler.should_throttle(i, int(clock["ms"])):
            throttler.throttle(pause)
    assert 1000 * 0.01 + 900 * 2 <= clock["ms"] <= 1000 * 0.01 + 902 * 2, clock
