"""`strom produce` and `strom consume` (kafka-console-producer / -consumer) against a real
broker: line and JSON formats with keys, headers and nulls, where reading starts, groups,
read_committed, topic patterns, and the ways they fail."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from datetime import datetime

import pytest
from confluent_kafka import Producer

from strom.testing import TIMESTAMP_BASE_MS, consume_all, create_topic, unique_name

from .conftest import fails, ok, strom

pytestmark = pytest.mark.timeout(120)


def values(output: str) -> list[str]:
    return output.splitlines()


def test_text_lines_keys_headers_and_nulls(cli_broker, tmp_path):
    bootstrap = cli_broker.bootstrap
    topic = unique_name("lines")
    create_topic(bootstrap, topic, 1)
    lines = "h1:a,h2:\tk1\tv1\nNULL\tk2\tNULL\nh3:c\tNULL\tv3\n\tk4\t\n"
    ok("produce", topic, "--bootstrap-server", bootstrap, "--property", "parse.headers=true",
       "--property", "parse.key=true", "--property", "null.marker=NULL", input=lines)
    got = consume_all(bootstrap, topic)
    assert [(m.headers() or [], m.key(), m.value()) for m in got] == [
        ([("h1", b"a"), ("h2", b"")], b"k1", b"v1"),
        ([], b"k2", None),
        ([("h3", b"c")], None, b"v3"),
        ([], b"k4", b""),  # an empty headers part: no headers
    ]

    shown = ok("consume", topic, "--bootstrap-server", bootstrap, "--from-beginning", "--exit-at-end",
               "--property", "print.key=true", "--property", "print.headers=true",
               "--property", "print.partition=true", "--property", "print.offset=true",
               "--property", "key.separator= | ", allow_stderr=True)
    assert values(shown)[:3] == [
        "Partition:0 | Offset:0 | h1:a,h2: | k1 | v1",
        "Partition:0 | Offset:1 | NO_HEADERS | k2 | null",
        "Partition:0 | Offset:2 | h3:c | null | v3",
    ]
    # The default shows values only; timestamps say their type.
    assert values(ok("consume", topic, "--bootstrap-server", bootstrap, "--from-beginning",
                     "--max-messages", "2", allow_stderr=True)) == ["v1", "null"]
    stamped = ok("consume", topic, "--bootstrap-server", bootstrap, "--from-beginning", "--max-messages",
                 "1", "--property", "print.timestamp=true", "--property", "print.value=false",
                 allow_stderr=True)
    assert stamped.startswith("CreateTime:") and int(stamped.strip().split(":")[1]) > 1_600_000_000_000


def test_json_lines_round_trip_and_copy(cli_broker):
    bootstrap = cli_broker.bootstrap
    topic, copy = unique_name("json"), unique_name("json-copy")
    create_topic(bootstrap, topic, 2)
    create_topic(bootstrap, copy, 2)
    records = [
        {"key": "k1", "value": "plain", "headers": {"trace": "1"}, "partition": 1, "timestamp": TIMESTAMP_BASE_MS},
        {"key": None, "value": {"base64": base64.b64encode(b"\x00\xffbin").decode()}, "partition": 0},
        {"key": "k3", "value": None, "headers": [["dup", "a"], ["dup", ""]], "partition": 1},
        {"key": "ünï", "value": "cödé", "partition": 0},
    ]
    ok("produce", topic, "--bootstrap-server", bootstrap, "--format", "json",
       input="\n".join(json.dumps(r) for r in records) + "\n\n")
    by_value = {m.value(): m for m in consume_all(bootstrap, topic)}
    assert by_value[b"\x00\xffbin"].key() is None and by_value[b"\x00\xffbin"].partition() == 0
    assert by_value[b"plain"].timestamp()[1] == TIMESTAMP_BASE_MS
    assert by_value[None].headers() == [("dup", b"a"), ("dup", b"")]
    assert by_value["cödé".encode()].key() == "ünï".encode()

    dumped = ok("consume", topic, "--bootstrap-server", bootstrap, "--from-beginning", "--exit-at-end",
                "--format", "json", allow_stderr=True)
    rows = [json.loads(line) for line in dumped.splitlines()]
    assert {(r["partition"], r["offset"]) for r in rows} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    plain = next(r for r in rows if r["value"] == "plain")
    assert (plain["key"], plain["headers"], plain["timestamp"], plain["timestamp_type"]) == \
        ("k1", [["trace", "1"]], TIMESTAMP_BASE_MS, "CreateTime")
    assert next(r for r in rows if r["partition"] == 0 and r["offset"] == 0)["value"] == \
        {"base64": base64.b64encode(b"\x00\xffbin").decode()}
    # What consume prints in JSON, produce takes back as it is: a copy of the topic.
    ok("produce", copy, "--bootstrap-server", bootstrap, "--format", "json", input=dumped)
    copied = ok("consume", copy, "--bootstrap-server", bootstrap, "--from-beginning", "--exit-at-end",
                "--format", "json", allow_stderr=True)
    strip = [{k: v for k, v in json.loads(line).items() if k != "topic"} for line in copied.splitlines()]
    assert sorted(strip, key=lambda r: (r["partition"], r["offset"])) == \
        sorted([{k: v for k, v in r.items() if k != "topic"} for r in rows],
               key=lambda r: (r["partition"], r["offset"]))


def test_where_reading_starts(cli_broker):
    bootstrap = cli_broker.bootstrap
    topic = unique_name("start")
    create_topic(bootstrap, topic, 1)
    base = TIMESTAMP_BASE_MS
    ok("produce", topic, "--bootstrap-server", bootstrap, "--format", "json",
       input="".join(json.dumps({"value": f"v{i}", "timestamp": base + 1000 * i}) + "\n" for i in range(10)))

    def read(*args: str) -> list[str]:
        done = strom("consume", topic, "--bootstrap-server", bootstrap, *args)
        assert done.returncode == 0, done
        assert done.stderr.splitlines()[-1] == f"Processed a total of {len(done.stdout.splitlines())} messages"
        return values(done.stdout)

    assert read("--partition", "0", "--offset", "4", "--max-messages", "3") == ["v4", "v5", "v6"]
    assert read("--partition", "0", "--offset", "earliest", "--max-messages", "1") == ["v0"]
    assert read("--from-timestamp", str(base + 7000), "--exit-at-end") == ["v7", "v8", "v9"]
    # In a group the start applies on assignment (the offsets looked up off the client's
    # network thread, where kafka-python refuses waiting calls).
    assert read("--group", unique_name("ts-group"), "--from-timestamp", str(base + 7000),
                "--exit-at-end") == ["v7", "v8", "v9"]
    local = datetime.fromtimestamp((base + 8500) / 1000).isoformat()  # local time, no zone
    assert read("--from-timestamp", local, "--exit-at-end") == ["v9"]
    assert read("--from-timestamp", str(base + 60_000), "--timeout-ms", "1000") == []
    assert read("--partition", "0", "--offset", "latest", "--timeout-ms", "1000") == []
    assert read("--timeout-ms", "1000") == []  # the default starts at the end
    assert read("--from-beginning", "--exit-at-end") == [f"v{i}" for i in range(10)]


def test_group_reads_on_from_its_commits(cli_broker):
    bootstrap = cli_broker.bootstrap
    topic, group = unique_name("grouped"), unique_name("cli-group")
    create_topic(bootstrap, topic, 2)
    ok("produce", topic, "--bootstrap-server", bootstrap, "--property", "parse.key=true",
       input="".join(f"k{i % 2}\tv{i}\n" for i in range(10)))
    first = values(ok("consume", topic, "--bootstrap-server", bootstrap, "--group", group,
                      "--from-beginning", "--max-messages", "4", allow_stderr=True))
    assert len(first) == 4
    # One join per consumer: an immediate second one (kafka-python's when its first
    # assignment saw no metadata, or a poll outlasted by the join) sometimes never completed.
    assert "re-joining group during Stable" not in "\n".join(
        line for line in cli_broker.log_text().splitlines() if group in line)
    rest = values(ok("consume", topic, "--bootstrap-server", bootstrap, "--group", group,
                     "--exit-at-end", allow_stderr=True))
    assert sorted(first + rest, key=lambda v: int(v[1:])) == [f"v{i}" for i in range(10)]
    described = ok("groups", "describe", group, "--bootstrap-server", bootstrap)
    lags = [line.split()[5] for line in described.splitlines() if line.startswith(group)]
    assert lags == ["0", "0"], described
    # --group and --partition exclude each other, as in kafka-console-consumer.
    assert "exclude each other" in fails("consume", topic, "--bootstrap-server", bootstrap, "--group",
                                         group, "--partition", "0", code=2)


def test_read_committed_skips_aborted_transactions(cli_broker):
    bootstrap = cli_broker.bootstrap
    topic = unique_name("txn")
    create_topic(bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("cli-txn")})
    producer.init_transactions(30)
    for batch, commit in ((["c1", "c2"], True), (["a1", "a2", "a3"], False), (["c3"], True)):
        producer.begin_transaction()
        for v in batch:
            producer.produce(topic, v.encode())
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    args = ("consume", topic, "--bootstrap-server", bootstrap, "--from-beginning", "--exit-at-end")
    assert values(ok(*args, "--isolation-level", "read_committed", allow_stderr=True)) == ["c1", "c2", "c3"]
    assert values(ok(*args, allow_stderr=True)) == ["c1", "c2", "a1", "a2", "a3", "c3"]


def test_include_pattern_reads_every_matching_topic(cli_broker):
    bootstrap = cli_broker.bootstrap
    prefix = unique_name("inc")
    for suffix in ("a", "b"):
        create_topic(bootstrap, f"{prefix}-{suffix}", 1)
        ok("produce", f"{prefix}-{suffix}", "--bootstrap-server", bootstrap, input=f"from-{suffix}\n")
    create_topic(bootstrap, f"{prefix}x-c", 1)
    got = ok("consume", "--include", f"{prefix}-.*", "--bootstrap-server", bootstrap, "--from-beginning",
             "--exit-at-end", allow_stderr=True)
    assert sorted(values(got)) == ["from-a", "from-b"]


def test_client_properties_reach_the_clients(cli_broker, tmp_path):
    bootstrap = cli_broker.bootstrap
    topic = unique_name("props")
    props = tmp_path / "client.properties"
    props.write_text(f"# shared by producer and consumer\nbootstrap.servers={bootstrap}\n"
                     "client.id=cli-props-test\ncompression.type=gzip\nno.such.setting=1\n")
    done = strom("produce", topic, "--command-config", str(props), input="zipped\n")
    assert done.returncode == 0, done
    assert done.stderr.strip() == ("Warning: ignoring client properties this client does not know: "
                                   "no.such.setting")
    assert [m.value() for m in consume_all(bootstrap, topic)] == [b"zipped"]
    # Kafka's alias of --command-config, with bootstrap.servers taken from the file.
    got = strom("consume", topic, "--consumer.config", str(props), "--from-beginning", "--exit-at-end")
    assert (got.returncode, got.stdout) == (0, "zipped\n"), got


def test_broken_pipe_ends_quietly(cli_broker):
    bootstrap = cli_broker.bootstrap
    topic = unique_name("pipe")
    create_topic(bootstrap, topic, 1)
    ok("produce", topic, "--bootstrap-server", bootstrap, input="".join(f"{i:0100d}\n" for i in range(5000)))
    done = subprocess.run(
        f"{sys.executable} -m strom consume {topic} --bootstrap-server {bootstrap} --from-beginning "
        "--exit-at-end 2>err.txt | head -n 2; cat err.txt", shell=True, capture_output=True,
        text=True, timeout=60, cwd=str(cli_broker.data_dir))
    lines = done.stdout.splitlines()
    assert lines[:2] == [f"{0:0100d}", f"{1:0100d}"]
    assert "Traceback" not in done.stdout and "Error" not in done.stdout, done.stdout[-2000:]


def test_failures_exit_non_zero_with_one_line(cli_broker, tmp_path):
    bootstrap = cli_broker.bootstrap
    topic = unique_name("fail")
    create_topic(bootstrap, topic, 1, config={"max.message.bytes": "300"})
    missing = unique_name("missing")
    assert fails("consume", missing, "--bootstrap-server", bootstrap) == f"Error: Topic '{missing}' does not exist."
    assert fails("consume", missing, "--bootstrap-server", bootstrap, "--group", unique_name("g")) == \
        f"Error: Topic '{missing}' does not exist."
    assert "Partition(s) 5" in fails("consume", topic, "--bootstrap-server", bootstrap, "--partition", "5")
    assert "--offset needs --partition" in fails("consume", topic, "--bootstrap-server", bootstrap,
                                                 "--offset", "3", code=2)
    assert "--offset" in fails("consume", topic, "--bootstrap-server", bootstrap, "--partition", "0",
                               "--offset", "-3", code=2)
    assert "unknown property 'print.keys'" in fails("consume", topic, "--bootstrap-server", bootstrap,
                                                    "--property", "print.keys=true", code=2)
    assert "unknown property" in fails("produce", topic, "--bootstrap-server", bootstrap,
                                       "--property", "parse.kee=true", code=2)

    # A line that does not parse stops the producer after what came before it was delivered.
    line = fails("produce", topic, "--bootstrap-server", bootstrap, "--format", "json",
                 input='{"value": "fine"}\n{"value": \n{"value": "never"}\n')
    assert line.startswith("Error: line 2: not JSON") and "(1 records before it were sent)" in line
    assert "line 1: no key separator found" in fails(
        "produce", topic, "--bootstrap-server", bootstrap, "--property", "parse.key=true", input="no tab\n")
    # ignore.error: a line without a separator is a value without a key.
    ok("produce", topic, "--bootstrap-server", bootstrap, "--property", "parse.key=true",
       "--property", "ignore.error=true", input="no tab either\n")
    assert [(m.key(), m.value()) for m in consume_all(bootstrap, topic)] == \
        [(None, b"fine"), (None, b"no tab either")]

    # What kafka-python cannot send (no key and no value, a null header value) is named by line.
    assert fails("produce", topic, "--bootstrap-server", bootstrap, "--format", "json",
                 input='{"key": null, "value": null}\n').startswith("Error: line 1: a record without key")
    assert fails("produce", topic, "--bootstrap-server", bootstrap, "--format", "json",
                 input='{"value": "v", "headers": {"h": null}}\n').startswith("Error: line 1: ")
    # Refused records: the count and the broker's reason.
    line = fails("produce", topic, "--bootstrap-server", bootstrap, "--sync", input="x" * 1000 + "\nsmall\n")
    assert line.startswith("Error: 1 of 2 records were not delivered: ") and "TooLarge" in line, line
    assert "not a valid topic name" in fails("produce", "not/a/topic", "--bootstrap-server", bootstrap,
                                             input="x\n", code=2)
    # Nobody listening: the clients give up after their bootstrap timeout, in one line.
    quick = tmp_path / "quick.properties"
    quick.write_text("bootstrap.timeout.ms=1500\n")
    for command in ("produce", "consume"):
        line = fails(command, topic, "--bootstrap-server", "127.0.0.1:1", "--command-config", str(quick), input="x\n")
        assert line.startswith("Error: ") and "bootstrap" in line.lower(), line
    assert "host:port" in fails("consume", topic, "--bootstrap-server", "not-a-host-port", code=2)
