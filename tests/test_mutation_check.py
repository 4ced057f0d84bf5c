"""scripts/mutation-check: each replication check it removes in a copy of the source is caught
by the quick tests that pin it, so a refactor that loses a check, or a test that stops testing
it, fails here (about 15 s: a pytest run per mutant)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a pytest run per mutant: not for the quick loop

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutation-check"


def test_every_mutant_is_killed_by_its_tests():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    killed = [line for line in result.stdout.splitlines() if line.startswith("killed")]
    assert len(killed) >= 15 and "SURVIVED" not in result.stdout


def test_a_check_whose_text_moved_fails_before_anything_runs(monkeypatch, capsys):
    loader = importlib.machinery.SourceFileLoader("mutation_check", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    monkeypatch.setitem(sys.modules, loader.name, module)  # its dataclass looks itself up there
    loader.exec_module(module)
    monkeypatch.setattr(module, "MUTANTS", [
        module.Mutant("renamed-check", "replication/partition.py", "a check no longer spelled so", "",
                      ("tests/no/such/test.py",))])
    assert module.main([]) == 1
    err = capsys.readouterr().err
    assert "renamed-check" in err and "occurs 0 times in src/strom/replication/partition.py" in err
