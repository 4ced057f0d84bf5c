"""Replica assignment as Kafka computes it (seed 000), rack-unaware and rack-aware."""

from __future__ import annotations

from collections import Counter

import pytest

from strom.controller.admin import (
    assign,
    assign_replicas,
    assign_replicas_rack_aware,
    rack_alternated,
)
from strom.protocol.errors import ErrorCode, KafkaError


def test_rack_unaware_matches_kafkas_example():
    # Kafka's documented example: 5 brokers, 10 partitions, RF 3, start index 0, shift 0.
    got = assign_replicas(10, 3, [0, 1, 2, 3, 4], start_index=0, replica_shift=0)
    assert [got[p][0] for p in range(10)] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    assert got[0] == [0, 1, 2] and got[5] == [0, 2, 3] and got[4] == [4, 0, 1]


def test_rack_alternated_interleaves_racks():
    racks = {0: "a", 1: "a", 2: "b", 3: "c", 4: "c", 5: "b"}
    assert rack_alternated(racks) == [0, 2, 3, 1, 5, 4]


@pytest.mark.parametrize("seed_start", range(6))
def test_rack_aware_puts_each_replica_on_another_rack(seed_start):
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    got = assign_replicas_rack_aware(12, 3, racks, start_index=seed_start, replica_shift=seed_start)
    for replicas in got.values():
        assert len(set(replicas)) == 3
        assert len({racks[r] for r in replicas}) == 3, replicas
    leaders = Counter(r[0] for r in got.values())
    assert set(leaders.values()) == {2}, "leaders spread evenly"


def test_assign_is_rack_aware_only_when_every_broker_has_a_rack():
    mixed = assign(6, 2, {1: "a", 2: None, 3: "b"})
    assert all(len(set(r)) == 2 for r in mixed.values())
    aware = assign(6, 2, {1: "a", 2: "a", 3: "b", 4: "b"})
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    assert all(racks[r[0]] != racks[r[1]] for r in aware.values())


def test_replication_factor_above_the_broker_count_is_refused():
    with pytest.raises(KafkaError) as e:
        assign(3, 4, {1: None, 2: None, 3: None})
    assert e.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
