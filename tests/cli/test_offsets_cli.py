"""`strom groups reset-offsets|delete-offsets` (kafka-consumer-groups.sh) and `strom get-offsets`
(kafka-get-offsets.sh) against a real broker, with an active group in a `strom consume`
subprocess where a command must refuse to touch it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime

import pytest

from strom.testing import create_topic, unique_name, wait_for

from .conftest import fails, ok, strom

pytestmark = pytest.mark.timeout(180)

COUNT = 10
SPACING_MS = 90_000  # record i of a partition is (COUNT - i) * 90 s old


@pytest.fixture(scope="module")
def filled(cli_broker):
    """Two topics of 2 partitions, each partition holding COUNT records (values p-i) whose
    timestamps grow by SPACING_MS up to about now; returns (topic, other, newest timestamp)."""
    bootstrap = cli_broker.bootstrap
    topic, other = unique_name("offsets"), unique_name("offsets-other")
    now = int(time.time() * 1000)
    for name in (topic, other):
        create_topic(bootstrap, name, 2)
        ok("produce", name, "--bootstrap-server", bootstrap, "--format", "json", input="".join(
            json.dumps({"value": f"{p}-{i}", "partition": p, "timestamp": now - (COUNT - i) * SPACING_MS}) + "\n"
            for p in (0, 1) for i in range(COUNT)))
    return topic, other, now - SPACING_MS


def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """CURRENT-OFFSET of each partition in `strom groups describe`."""
    done = strom("groups", "describe", group, "--bootstrap-server", bootstrap)
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(group + " ")]
    return {(r[1], int(r[2])): int(r[3]) for r in rows if r[3] != "-"}


def reset(bootstrap: str, group: str, *args: str, warned: bool = False) -> dict[tuple[str, int], int]:
    """NEW-OFFSET of each partition a successful reset-offsets prints (with warnings on stderr
    only if `warned`)."""
    out = ok("groups", "reset-offsets", group, "--bootstrap-server", bootstrap, *args, allow_stderr=warned)
    rows = [line.split() for line in out.splitlines()[1:]]
    assert all(r[0] == group for r in rows), out
    return {(r[1], int(r[2])): int(r[3]) for r in rows}


def test_reset_offsets_every_way(cli_broker, filled, tmp_path):
    bootstrap = cli_broker.bootstrap
    topic, other, newest = filled
    group = unique_name("reset")
    both = {(topic, 0), (topic, 1)}

    def expect(offsets: dict[int, int]) -> dict[tuple[str, int], int]:
        return {(topic, p): o for p, o in offsets.items()}

    # A group that does not exist yet may be given offsets.
    assert reset(bootstrap, group, "--topic", topic, "--to-offset", "3", "--execute") == expect({0: 3, 1: 3})
    assert committed(bootstrap, group) == expect({0: 3, 1: 3})
    # Dry runs change nothing; without --dry-run they say so on stderr.
    assert reset(bootstrap, group, "--topic", topic, "--to-earliest", "--dry-run") == expect({0: 0, 1: 0})
    done = strom("groups", "reset-offsets", group, "--bootstrap-server", bootstrap, "--topic", topic, "--to-latest")
    assert done.returncode == 0 and "nothing was changed" in done.stderr and "10" in done.stdout
    assert committed(bootstrap, group) == expect({0: 3, 1: 3})

    assert reset(bootstrap, group, "--all-topics", "--shift-by", "-2", "--execute") == expect({0: 1, 1: 1})
    done = strom("groups", "reset-offsets", group, "--bootstrap-server", bootstrap, "--all-topics",
                 "--shift-by", "100", "--execute")
    assert done.returncode == 0 and "outside [0, 10]" in done.stderr  # kept at the log end
    assert committed(bootstrap, group) == expect({0: 10, 1: 10})
    assert reset(bootstrap, group, "--topic", f"{topic}:1", "--to-earliest", "--execute") == expect({1: 0})
    assert committed(bootstrap, group) == expect({0: 10, 1: 0})
    assert reset(bootstrap, group, "--topic", topic, "--to-offset", "-5", "--execute",
                 warned=True) == expect({0: 0, 1: 0})

    # By time: the first record at or after it; the log end where none is that recent.
    fourth = newest - (COUNT - 5) * SPACING_MS  # the timestamp of record 4
    assert reset(bootstrap, group, "--topic", topic, "--to-datetime", str(fourth), "--execute") == expect({0: 4, 1: 4})
    local = datetime.fromtimestamp((fourth + 1) / 1000).isoformat(timespec="milliseconds")
    assert reset(bootstrap, group, "--topic", topic, "--to-datetime", local, "--dry-run") == expect({0: 5, 1: 5})
    assert reset(bootstrap, group, "--topic", f"{topic}:0", "--to-datetime", str(newest + 60_000),
                 "--dry-run") == expect({0: 10})
    # A duration reaching back to halfway between records 5 and 6 finds record 6. It is reckoned
    # from now, not from when the records were written: a slow run may have passed since.
    sixth = newest - (COUNT - 7) * SPACING_MS  # the timestamp of record 6
    back_s = (int(time.time() * 1000) - sixth + SPACING_MS // 2) // 1000
    assert reset(bootstrap, group, "--topic", topic, "--by-duration", f"PT{back_s}S", "--dry-run") == expect({0: 6, 1: 6})

    # --to-current keeps commits and takes the log end where there are none.
    current = reset(bootstrap, group, "--topic", topic, "--topic", other, "--to-current", "--dry-run")
    assert current == {**expect({0: 4, 1: 4}), (other, 0): 10, (other, 1): 10}

    # --export writes the CSV that --from-file reads back.
    plan = ok("groups", "reset-offsets", group, "--bootstrap-server", bootstrap, "--topic", topic,
              "--to-offset", "7", "--export", "--dry-run")
    assert plan.splitlines() == [f"{topic},0,7", f"{topic},1,7"]
    (tmp_path / "plan.csv").write_text(plan)
    assert reset(bootstrap, group, "--from-file", str(tmp_path / "plan.csv"), "--execute") == expect({0: 7, 1: 7})
    assert set(committed(bootstrap, group)) == both

    # Mistakes on the command line (2) and refusals (1), each in one line.
    base = ("groups", "reset-offsets", group, "--bootstrap-server", bootstrap)
    assert "exactly one of" in fails(*base, "--topic", topic, "--to-earliest", "--to-latest", code=2)
    assert "exactly one of" in fails(*base, "--topic", topic, code=2)
    assert "--all-topics" in fails(*base, "--topic", topic, "--all-topics", "--to-earliest", code=2)
    assert "duration" in fails(*base, "--topic", topic, "--by-duration", "90 minutes", code=2)
    assert "date-time" in fails(*base, "--topic", topic, "--to-datetime", "yesterday", code=2)
    missing = unique_name("missing")
    assert fails(*base, "--topic", missing, "--to-earliest") == f"Error: Topic '{missing}' does not exist."
    assert "Partition(s) 7" in fails(*base, "--topic", f"{topic}:0,7", "--to-earliest")
    assert "no committed offset" in fails(*base, "--topic", other, "--shift-by", "1")
    assert committed(bootstrap, group) == expect({0: 7, 1: 7})  # none of them changed anything


def test_active_groups_are_refused_and_offsets_deleted(cli_broker, filled):
    bootstrap = cli_broker.bootstrap
    topic, other, _ = filled
    group = unique_name("active")
    reset(bootstrap, group, "--topic", topic, "--topic", other, "--to-offset", "2", "--execute")
    member = subprocess.Popen([sys.executable, "-m", "strom", "consume", topic, "--group", group,
                               "--bootstrap-server", bootstrap], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(member.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: "Stable" in strom("groups", "describe", group, "--state",
                                           "--bootstrap-server", bootstrap).stdout,
                 timeout=60, what="the consumer to join")
        line = fails("groups", "reset-offsets", group, "--bootstrap-server", bootstrap, "--topic", topic,
                     "--to-earliest", "--execute")
        assert line == (f"Error: Assignments can only be reset if the group '{group}' is inactive, "
                        "but the current state is Stable.")
        # The group consumes `topic`: its offsets stay; `other`'s may go.
        done = strom("groups", "delete-offsets", group, "--bootstrap-server", bootstrap, "--topic", topic,
                     "--topic", f"{other}:1")
        assert done.returncode == 1, done
        rows = {tuple(line.split()[:2]): line.split()[2:] for line in done.stdout.splitlines()[1:]}
        assert rows == {(topic, "0"): ["Error:", "GROUP_SUBSCRIBED_TO_TOPIC"],
                        (topic, "1"): ["Error:", "GROUP_SUBSCRIBED_TO_TOPIC"], (other, "1"): ["Successful"]}
        assert done.stderr.strip() == ("Error: the offsets of 2 partition(s) were not deleted "
                                       "(GROUP_SUBSCRIBED_TO_TOPIC)")
        # It reads on from the group's offsets (2) to the end of `topic`.
        wait_for(lambda: len(printed) == 2 * (COUNT - 2), timeout=60, what="the member's records")
    finally:
        member.send_signal(signal.SIGINT)  # Ctrl-C: the consumer leaves the group and says so
        err = member.stderr.read()
        member.wait(timeout=60)
        reader.join(timeout=10)
    # It committed what it printed as it left.
    assert sorted(printed) == sorted(f"{p}-{i}\n" for p in (0, 1) for i in range(2, COUNT))
    assert member.returncode == 0 and err.strip().endswith("Processed a total of 16 messages"), err
    assert committed(bootstrap, group) == {(topic, 0): 10, (topic, 1): 10, (other, 0): 2}
    # With the member gone the group is empty: its offsets may be reset and deleted.
    wait_for(lambda: "Empty" in strom("groups", "describe", group, "--state",
                                      "--bootstrap-server", bootstrap).stdout, timeout=60, what="an empty group")
    reset(bootstrap, group, "--topic", topic, "--to-latest", "--execute")
    out = ok("groups", "delete-offsets", group, "--bootstrap-server", bootstrap, "--topic", topic)
    assert out.splitlines()[1:] == [f"{topic}  0          Successful", f"{topic}  1          Successful"]
    assert committed(bootstrap, group) == {(other, 0): 2}
    nobody = unique_name("nobody")
    assert fails("groups", "delete-offsets", nobody, "--bootstrap-server", bootstrap, "--topic", topic) == \
        f"Error: Consumer group '{nobody}' does not exist."


def test_get_offsets(cli_broker, filled):
    bootstrap = cli_broker.bootstrap
    topic, other, newest = filled

    def offsets(*args: str) -> list[str]:
        return ok("get-offsets", "--bootstrap-server", bootstrap, *args).splitlines()

    assert offsets("--topic", topic) == [f"{topic}:0:10", f"{topic}:1:10"]
    assert offsets("--topic", topic, "--time", "earliest", "--partitions", "1") == [f"{topic}:1:0"]
    assert offsets("--topic", topic, "--time", "-2") == [f"{topic}:0:0", f"{topic}:1:0"]
    fourth = newest - (COUNT - 5) * SPACING_MS
    assert offsets("--topic", topic, "--time", str(fourth), "--partitions", "0") == [f"{topic}:0:4"]
    local = datetime.fromtimestamp(fourth / 1000).isoformat(timespec="milliseconds")
    assert offsets("--topic", topic, "--time", local, "--partitions", "0") == [f"{topic}:0:4"]
    assert offsets("--topic", topic, "--time", "max-timestamp") == [f"{topic}:0:9", f"{topic}:1:9"]
    # No record that recent: an empty offset, as kafka-get-offsets prints it.
    assert offsets("--topic", topic, "--time", str(newest + 1), "--partitions", "0") == [f"{topic}:0:"]
    # Regular expressions match whole names; --topic-partitions takes Kafka's list syntax.
    prefix = topic.rsplit("-", 1)[0]
    assert offsets("--topic", f"{prefix}.*", "--partitions", "0") == sorted([f"{other}:0:10", f"{topic}:0:10"])
    assert offsets("--topic-partitions", f"{topic}:1,{other}:0-1", "--time", "earliest") == \
        sorted([f"{other}:0:0", f"{other}:1:0", f"{topic}:1:0"])
    everything = offsets()
    assert f"{topic}:0:10" in everything and any(line.startswith("__consumer_offsets:") for line in everything)
    assert not any(line.startswith("__") for line in offsets("--exclude-internal-topics"))

    for unmatched in (unique_name("none"), prefix):  # a prefix is not a whole name
        assert fails("get-offsets", "--bootstrap-server", bootstrap, "--topic", unmatched) == \
            "Error: no topic partition matches the filters"
    assert "regular expression" in fails("get-offsets", "--bootstrap-server", bootstrap, "--topic", "(", code=2)
    assert "--topic-partitions" in fails("get-offsets", "--bootstrap-server", bootstrap, "--topic", topic,
                                         "--topic-partitions", topic, code=2)
    assert "date-time" in fails("get-offsets", "--bootstrap-server", bootstrap, "--time", "soon", code=2)


def test_kafka_consumer_groups_command_lines(cli_broker, filled):
    """kafka-consumer-groups.sh's lines with only the script's name changed: the action as a flag,
    the group as --group, --all-groups, --offsets; and kafka-configs.sh's --entity-type lines."""
    bootstrap = cli_broker.bootstrap
    topic, _, _ = filled
    group, other = unique_name("kafka-style"), unique_name("kafka-style-other")
    for g in (group, other):
        ok("groups", "--reset-offsets", "--group", g, "--topic", topic, "--to-earliest", "--execute",
           "--bootstrap-server", bootstrap)
    assert {group, other} <= set(ok("groups", "--list", "--bootstrap-server", bootstrap).split())
    described = ok("groups", "--describe", "--group", group, "--offsets", "--bootstrap-server", bootstrap)
    assert committed(bootstrap, group) == {(topic, 0): 0, (topic, 1): 0}
    assert described == strom("groups", "describe", group, "--bootstrap-server", bootstrap).stdout
    every = ok("groups", "--describe", "--all-groups", "--state", "--bootstrap-server", bootstrap)
    assert group in every and other in every
    assert "was successful" in ok("groups", "--delete", "--group", other, "--bootstrap-server", bootstrap)
    assert other not in ok("groups", "--list", "--bootstrap-server", bootstrap).split()
    ok("groups", "--delete-offsets", "--group", group, "--topic", topic, "--bootstrap-server", bootstrap)
    assert committed(bootstrap, group) == {}
    assert "or --all-groups" in fails("groups", "--describe", "--bootstrap-server", bootstrap, code=2)

    ok("configs", "--alter", "--entity-type", "topics", "--entity-name", topic, "--add-config", "retention.ms=7200000",
       "--bootstrap-server", bootstrap)
    described = ok("configs", "--describe", "--entity-type", "topics", "--entity-name", topic,
                   "--bootstrap-server", bootstrap)
    assert described.startswith(f"Dynamic configs for topic {topic} are:") and "retention.ms=7200000" in described
    assert "All configs for broker 0 are:" in ok("configs", "--describe", "--entity-type", "brokers", "--entity-name",
                                                 "0", "--all", "--bootstrap-server", bootstrap)
    assert "the default broker" in ok("configs", "--describe", "--entity-type", "brokers", "--entity-default",
                                      "--bootstrap-server", bootstrap)
    assert "strom quotas" in fails("configs", "--describe", "--entity-type", "users", "--entity-name", "alice",
                                   "--bootstrap-server", bootstrap, code=2)
