"""The `strom` command line run as users run it: a subprocess against real brokers.

`cli_broker` is one broker shared by the client-command tests (each test uses its own topics
and groups); `strom(...)` runs a command and returns the finished process; `ok` insists on
exit code 0 and a quiet stderr; `fails` on a given exit code and returns stderr's last line;
`free_port_run` finds consecutive free ports for `strom cluster up`.
"""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from strom.testing import BrokerProcess, report_broker_logs

pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(report_broker_logs)

# A group joins at once (no initial rebalance delay) and short sessions are allowed.
CLI_BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000",
                        "offsets.topic.num.partitions": "4", "transaction.state.log.num.partitions": "4",
                        "num.partitions": "2"}


@pytest.fixture(scope="session")
def cli_broker():
    with BrokerProcess(overrides=CLI_BROKER_OVERRIDES) as proc:
        yield proc


def strom(*args: str, input: bytes | str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`strom ARGS...` with stdin `input`; stdout and stderr as text unless `input` is bytes."""
    binary = isinstance(input, bytes)
    return subprocess.run([sys.executable, "-m", "strom", *args], input=input, capture_output=True,
                          text=not binary, timeout=timeout)


def ok(*args: str, input: bytes | str | None = None, allow_stderr: bool = False) -> str:
    """stdout of a command that must succeed (with nothing on stderr unless allowed)."""
    done = strom(*args, input=input)
    assert done.returncode == 0, done
    if not allow_stderr:
        assert not done.stderr, done
    return done.stdout


def fails(*args: str, code: int = 1, input: bytes | str | None = None) -> str:
    """The last stderr line of a command that must exit with `code`: one line saying why."""
    done = strom(*args, input=input)
    assert done.returncode == code, done
    lines = done.stderr.strip().splitlines()
    assert lines, done
    assert "Traceback" not in done.stderr, done
    return lines[-1]


def free_port_run(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 now (`strom cluster up` takes a
    base port for its brokers and one for its controllers). They are taken below the ephemeral
    range, where the nodes' own outgoing connections cannot take one before a node binds it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    low = max(low, 10_000 + count + 1)
    for _ in range(200):
        first = random.randrange(10_000, low - count)
        try:
            for port in range(first, first + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise AssertionError(f"no {count} consecutive free ports")
