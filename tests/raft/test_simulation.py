"""The Raft core under deterministic simulation (see raft_sim): 1,500 seeds a run (the suite's
time on two cores is the budget; a soak runs more), each a
cluster shape (1, 3 or 5 voters, observers, static or KIP-853 dynamic voters) and a fault mix
(drops, duplicates, delays that reorder, partitions, crashes losing unflushed writes, leader
churn, clean shutdowns, voter changes), with the invariants checked after every event and
liveness checked after the faults heal.

STROM_RAFT_SEEDS=N runs N seeds (a soak); STROM_RAFT_SEED=S runs only seed S; and
`.venv/bin/python tests/raft/raft_sim.py S` replays seed S printing its trace.
"""

from __future__ import annotations

import os

import pytest
from raft_sim import InvariantViolation, run_seed

from strom.raft.core import SafetyViolation

SEEDS = int(os.environ.get("STROM_RAFT_SEEDS", "1500"))
CHUNKS = 24
ONLY = os.environ.get("STROM_RAFT_SEED")


def _run(seed: int) -> None:
    try:
        run_seed(seed)
    except (InvariantViolation, SafetyViolation, AssertionError, ValueError) as e:
        pytest.fail(f"{e}\nreplay it: .venv/bin/python tests/raft/raft_sim.py {seed}", pytrace=False)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_seeds(chunk: int) -> None:
    seeds = [int(ONLY)] if ONLY is not None else range(SEEDS)
    for seed in seeds:
        if seed % CHUNKS == chunk:
            _run(seed)


def test_same_seed_same_run() -> None:
    """Determinism: one seed gives the same history twice (so a failing seed replays)."""
    a, b = run_seed(12345, trace=True), run_seed(12345, trace=True)
    assert a.log_lines == b.log_lines and a.committed == b.committed and a.leaders == b.leaders
    assert a.committed, "the run committed nothing"
