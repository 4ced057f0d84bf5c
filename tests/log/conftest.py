"""Fixtures for the storage engine tests; helpers live in logtest_support (importable from any
test module here, whatever pytest's import mode)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from logtest_support import Clock  # noqa: E402

from strom.log import Log, LogConfig  # noqa: E402


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def open_log(tmp_path: Path, clock: Clock):
    """open_log(config=None, name="topic-0", **Log.open kwargs) -> Log, closed at teardown."""
    opened: list[Log] = []

    def _open(config: LogConfig | None = None, name: str = "topic-0", **kwargs) -> Log:
        kwargs.setdefault("now_ms", clock)
        log = Log.open(tmp_path / name, config or LogConfig(), **kwargs)
        opened.append(log)
        return log

    yield _open
    for log in opened:
        log.close()
