"""The pytest plugin users get with Strom: the README's example, run as printed in a pytest of
its own (the plugin found through its entry point), and the fixture used here directly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    section = README.read_text().split("## Testing your application", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's pytest example is missing"
    return match.group(1)


def test_the_readme_example_passes_in_a_project_of_its_own(tmp_path):
    (tmp_path / "test_orders.py").write_text(readme_example())
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "test_orders.py"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout


def test_a_failing_test_against_the_fixture_fails(tmp_path):
    # The fixture does not make everything pass: a wrong expectation is reported.
    wrong = readme_example().replace('== b"paid"', '== b"refunded"')
    (tmp_path / "test_orders.py").write_text(wrong)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "test_orders.py"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and "1 failed" in result.stdout, result.stdout[-2000:]


def test_fixture_topics_and_configs(strom_broker):
    from strom.client import Connection

    first, second = strom_broker.new_topic("t", partitions=2), strom_broker.new_topic("t")
    assert first != second
    assert strom_broker.create_topic(first, partitions=2, exist_ok=True) == first
    with Connection("127.0.0.1", strom_broker.process.port) as conn:
        body = conn.call(3, 12, {"topics": [{"name": first}], "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": False})
    assert body.topics[0].error_code == 0 and len(body.topics[0].partitions) == 2
