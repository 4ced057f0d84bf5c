"""The pytest plugin users get with Strom: the README's example, run as printed in a pytest of
its own (the plugin found through its entry point), and the fixture used here directly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_blocks() -> list[str]:
    """The section's Python blocks: the example test, then the conftest.py that configures the
    broker."""
    section = README.read_text().split("## Testing your application", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def readme_example() -> str:
    blocks = readme_blocks()
    assert blocks, "the README's pytest example is missing"
    return blocks[0]


def run_pytest(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=project, capture_output=True, text=True, timeout=120)


def test_the_readme_example_passes_in_a_project_of_its_own(tmp_path):
    (tmp_path / "test_orders.py").write_text(readme_example())
    result = run_pytest(tmp_path, "test_orders.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout
    # The plugin adds no warnings of its own (kafka-python's DeprecationWarnings, say).
    assert "warning" not in result.stdout.lower(), result.stdout[-3000:]


def test_the_readme_broker_config_override(tmp_path):
    blocks = readme_blocks()
    assert len(blocks) == 2, "the README's strom_broker_config example is missing"
    (tmp_path / "conftest.py").write_text(blocks[1])
    # What the override asks for holds: 3 partitions by default, no auto-creation.
    (tmp_path / "test_config.py").write_text(
        "from strom.client import Connection\n\n"
        "def test_configured(strom_broker):\n"
        "    topic = strom_broker.new_topic('t', partitions=-1)  # the broker's num.partitions\n"
        "    with Connection('127.0.0.1', strom_broker.process.port) as conn:\n"
        "        body = conn.call(3, 12, {'topics': [{'name': topic}, {'name': 'nowhere'}],\n"
        "                                 'allow_auto_topic_creation': True,\n"
        "                                 'include_topic_authorized_operations': False})\n"
        "    created, missing = body.topics\n"
        "    assert len(created.partitions) == 3\n"
        "    assert missing.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION: not auto-created\n")
    result = run_pytest(tmp_path)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout[-3000:]
    # Without scope="session" pytest refuses the override, as the README says.
    (tmp_path / "conftest.py").write_text(blocks[1].replace('@pytest.fixture(scope="session")',
                                                            "@pytest.fixture"))
    result = run_pytest(tmp_path)
    assert result.returncode != 0 and "ScopeMismatch" in result.stdout, result.stdout[-3000:]


def test_a_failing_test_against_the_fixture_fails(tmp_path):
    # The fixture does not make everything pass: a wrong expectation is reported.
    wrong = readme_example().replace('== b"paid"', '== b"refunded"')
    (tmp_path / "test_orders.py").write_text(wrong)
    result = run_pytest(tmp_path, "test_orders.py")
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


def test_the_extra_the_readme_names_brings_pytest():
    import tomllib

    section = README.read_text().split("## Testing your application", 1)[1].split("\n## ", 1)[0]
    assert "pip install 'strom[pytest]'" in " ".join(section.split())
    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(re.match(r"pytest\b", requirement) for requirement in extras["pytest"])
