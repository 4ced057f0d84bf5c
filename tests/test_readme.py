"""The README's code runs as printed: the client examples of "Connect your client" and every
block of "PySpark" (the scripts as the files the text names, then the shell lines that run
them), against a real broker. Only the broker's address, the interpreter's path and /tmp
checkpoint paths are substituted; a shell line's trailing `# comment` is output it must print."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from strom.testing import BrokerProcess

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def section(title: str) -> str:
    text = README.read_text().split(f"\n## {title}\n", 1)[1]
    return text.split("\n## ", 1)[0]


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(language, code, the file name the text before it gives: "as `name.py`")."""
    out = []
    for match in BLOCK.finditer(text):
        named = re.search(r"as `([\w.]+\.py)`:\s*$", text[:match.start()])
        out.append((match[1], match[2], named[1] if named else ""))
    return out


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess() as proc:
        yield proc


def localize(code: str, broker: BrokerProcess, work: Path) -> str:
    # /tmp paths first: the interpreter's own path may lie under /tmp (a CI checkout).
    code = re.sub(r"/tmp/([\w-]+)", lambda m: str(work / m[1]), code)
    return code.replace("127.0.0.1:9092", broker.bootstrap).replace(".venv/bin/python", sys.executable)


def run_python(code: str, work: Path, name: str = "example.py") -> str:
    (work / name).write_text(code)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, name], cwd=work, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"{name}:\n{code}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def run_shell_line(line: str, work: Path) -> None:
    command, _, expected = line.partition("#")
    done = subprocess.run(["bash", "-c", command], cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    assert expected.strip() in done.stdout, f"{command}: expected {expected.strip()!r}, got {done.stdout!r}"


def test_connect_your_client(broker, tmp_path):
    python = [code for lang, code, _ in blocks(section("Connect your client")) if lang == "python"]
    assert len(python) == 3  # confluent-kafka, kafka-python, aiokafka
    for code in python:
        assert "hello" in run_python(localize(code, broker, tmp_path), tmp_path)


def test_pyspark(broker, tmp_path):
    ran = []
    for lang, code, name in blocks(section("PySpark")):
        code = localize(code, broker, tmp_path)
        if lang == "python":
            assert name, f"a PySpark block with no file name before it:\n{code}"
            (tmp_path / name).write_text(code)  # run by the shell block that follows
        else:
            assert lang == "sh"
            for line in code.splitlines():
                run_shell_line(line, tmp_path)
                ran.append(line)
    assert any("clicks.py" in line for line in ran) and any("click_counts.py" in line for line in ran)
