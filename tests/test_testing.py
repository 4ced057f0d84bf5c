"""strom.testing's BrokerProcess log: what a test reads is everything the broker wrote before.

The child here stands in for a broker (it becomes `sys.executable`, which BrokerProcess starts
with `-m strom serve ...`): it announces itself ready, then for each byte read from one FIFO it
logs a line to stderr and answers on another, as a broker logs and then answers a request."""

from __future__ import annotations

import os
import sys
import threading
import types

import pytest

import strom.testing
from strom.testing import BrokerProcess

CHILD = """\
#!{python}
import os, sys
print("stand-in ready on PLAINTEXT://127.0.0.1:9 (not a broker)", flush=True)
if os.environ.get("EXIT_AFTER"):
    sys.stderr.write("".join(f"run line {{n}}\\n" for n in range(int(os.environ["EXIT_AFTER"]))))
    sys.exit(0)
requests = open(os.environ["REQUESTS"], "rb", buffering=0)
answers = open(os.environ["ANSWERS"], "wb", buffering=0)
n = 0
while requests.read(1):
    sys.stderr.write(f"handled request {{n}}\\n")
    sys.stderr.flush()
    answers.write(b".")
    n += 1
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A broker-like child, its FIFOs, and a BrokerProcess that starts it."""
    child = tmp_path / "child"
    child.write_text(CHILD.format(python=sys.executable))
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))  # also keeps it from being forked
    requests, answers = tmp_path / "requests", tmp_path / "answers"
    os.mkfifo(requests)
    os.mkfifo(answers)
    env = {"REQUESTS": str(requests), "ANSWERS": str(answers)}
    broker = BrokerProcess(data_dir=tmp_path, env=env)
    yield broker, requests, answers
    broker.close()


def _exchange(broker, requests, answers, count: int) -> None:
    with open(requests, "wb", buffering=0) as req, open(answers, "rb", buffering=0) as ans:
        for n in range(count):
            req.write(b".")
            assert ans.read(1) == b"."
            assert f"handled request {n}" in broker.log_text(), f"line {n} missing"


def test_log_text_has_the_line_logged_before_each_answer(stand_in):
    broker, requests, answers = stand_in
    broker.start()
    _exchange(broker, requests, answers, 300)


class _NeverRuns:
    """A reader thread that never gets the CPU: the most a draining thread can lag."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def start(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass


@pytest.fixture
def idle_readers(monkeypatch):
    monkeypatch.setattr(strom.testing, "threading",
                        types.SimpleNamespace(Thread=_NeverRuns, Lock=threading.Lock))


def test_log_text_does_not_wait_on_a_reader_thread(stand_in, idle_readers):
    broker, requests, answers = stand_in
    broker.start()
    _exchange(broker, requests, answers, 3)


def test_a_run_that_ended_by_itself_keeps_its_lines_before_the_next_runs(stand_in, idle_readers):
    broker, _, _ = stand_in
    broker.env["EXIT_AFTER"] = "2000"
    broker.start()
    assert broker.proc.wait(10) == 0
    broker.env["EXIT_AFTER"] = "1"
    broker.start()
    broker.proc.wait(10)
    lines = [line for line in broker.log_text().splitlines() if line.startswith("run line")]
    assert lines == [f"run line {n}" for n in range(2000)] + ["run line 0"]
