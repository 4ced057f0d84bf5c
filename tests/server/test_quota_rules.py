"""The quota rules on their own: which entity's quota applies (Kafka's precedence), how the
usage is metered (a default quota applies to each user or client separately), the windowed
rate and the throttle time it earns."""

from __future__ import annotations

import pytest

from strom.network.quotas import ClientQuotas, ConnectionRates, Rate, check_entity, throttle_ms


def test_the_most_specific_entity_sets_the_quota():
    entities = {
        "users/alice/clients/app": {"producer_byte_rate": "100"},
        "users/alice": {"producer_byte_rate": "200", "consumer_byte_rate": "300"},
        "users/<default>": {"producer_byte_rate": "400"},
        "clients/<default>": {"producer_byte_rate": "500", "consumer_byte_rate": "600"},
    }
    quotas = ClientQuotas(entities)
    assert quotas._resolve("alice", "app", "producer_byte_rate") == ("users/alice/clients/app", 100.0)
    assert quotas._resolve("alice", "other", "producer_byte_rate") == ("users/alice", 200.0)
    assert quotas._resolve("alice", "app", "consumer_byte_rate") == ("users/alice", 300.0)
    assert quotas._resolve("bob", "x", "producer_byte_rate") == ("users/bob", 400.0)  # each user its own
    assert quotas._resolve("bob", "x", "consumer_byte_rate") == ("clients/x", 600.0)
    assert quotas._resolve("bob", "x", "request_percentage") is None


def test_a_default_quota_is_metered_per_user():
    quotas = ClientQuotas({"users/<default>": {"producer_byte_rate": "1000"}}, window_s=1, samples=2)
    assert quotas.record("alice", "a", "producer_byte_rate", 5000, now=0.0) > 0
    assert quotas.record("bob", "b", "producer_byte_rate", 500, now=0.0) == 0  # alice's bytes are hers


def test_rate_and_throttle_follow_kafkas_formula():
    rate = Rate(window_s=1, samples=11)
    rate.record(30_000, now=0.0)
    observed, elapsed = rate.measure(now=0.5)
    assert elapsed == 10  # at least samples - 1 windows
    assert observed == 3000
    assert throttle_ms(rate, 1000, 0.5, 11_000) == 11_000  # (3000 - 1000) / 1000 * 10 s = 20 s, capped
    assert throttle_ms(rate, 2000, 0.5, 60_000) == 5000  # (3000 - 2000) / 2000 * 10 s
    assert throttle_ms(rate, 3000, 0.5, 60_000) == 0
    rate.record(1, now=20.0)  # old windows fall out
    assert rate.measure(now=20.0)[0] == pytest.approx(0.1)


def test_connection_rates():
    rates = ConnectionRates({"ips/<default>": {"connection_creation_rate": "2"}, "ips/10.0.0.9": {}}, 1, 2)
    admitted = [rates.admit("10.0.0.1", 2**31 - 1, now=0.1) for _ in range(4)]
    assert admitted[:2] == [None, None] and all("connection_creation_rate of 10.0.0.1" in a for a in admitted[2:])
    assert rates.admit("10.0.0.2", 2**31 - 1, now=0.1) is None  # per address
    assert "max.connection.creation.rate" in ConnectionRates({}, 1, 2).admit("10.0.0.3", 0, now=0.0)


@pytest.mark.parametrize(("entity", "path"), [
    ({"user": "alice"}, "users/alice"), ({"user": None}, "users/<default>"),
    ({"user": "a b", "client-id": None}, "users/a%20b/clients/<default>"), ({"client-id": "x"}, "clients/x"),
    ({"ip": "10.1.2.3"}, "ips/10.1.2.3"), ({"ip": None}, "ips/<default>"),
])
def test_entities_map_to_kafkas_config_paths(entity, path):
    assert check_entity(entity) == path


@pytest.mark.parametrize("entity", [{"user": "a", "ip": "10.0.0.1"}, {"ip": "nope"}, {}])
def test_entities_kafka_refuses(entity):
    with pytest.raises(ValueError):
        check_entity(entity)
