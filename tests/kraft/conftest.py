"""KRaft quorums of real `strom serve` processes (process.roles=controller), one per module."""

from __future__ import annotations

import pytest

from strom.testing import report_broker_logs

pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(report_broker_logs)
