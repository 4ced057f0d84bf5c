"""Strom's own client renews its SASL sessions (KIP-368): against a broker whose
connections.max.reauth.ms is short, an AsyncConnection (the brokers' connections to each other)
and a blocking Connection keep working on one connection across many session lifetimes, each
renewal logged by the broker as a new authentication from the same address."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import pytest

from strom.client import AsyncConnection, ClientSecurity, Connection
from strom.testing import BrokerProcess

LIFETIME_MS = 1000
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')
METADATA = (3, 1, {"topics": []})


@pytest.fixture(scope="module")
def broker():
    overrides = {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                 "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
                 "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
                 "connections.max.reauth.ms": str(LIFETIME_MS)}
    with BrokerProcess(overrides=overrides, env={"STROM_LOG_LEVEL": "strom.network.socket_server=DEBUG"}) as b:
        done = subprocess.run([sys.executable, "-m", "strom", "users", "scram-set", "bob", "--mechanism",
                               "SCRAM-SHA-256", "--password", "bob-secret", "--bootstrap-server", b.bootstrap],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        yield b


def sessions_of(broker, local: tuple[str, int], principal: str) -> int:
    """How many times the broker authenticated the connection from `local`."""
    pattern = re.compile(rf"\b{re.escape(local[0])}:{local[1]} authenticated as {re.escape(principal)} ")
    return sum(1 for line in broker.stderr_lines if pattern.search(line))


@pytest.mark.parametrize("mechanism,user,password", [("PLAIN", "alice", "alice-secret"),
                                                     ("SCRAM-SHA-256", "bob", "bob-secret")])
def test_async_connection_renews_its_session(broker, mechanism, user, password):
    """Requests every 200 ms for four session lifetimes, then one after an idle stretch longer
    than a lifetime: the connection is never closed, and the broker saw it authenticate again."""
    security = ClientSecurity(sasl_mechanism=mechanism, username=user, password=password)

    async def run() -> tuple[str, int]:
        conn = await AsyncConnection.open("127.0.0.1", broker.ports["SASL_PLAINTEXT"], security=security)
        try:
            local = conn.writer.get_extra_info("sockname")
            deadline = time.monotonic() + 4 * LIFETIME_MS / 1000
            while time.monotonic() < deadline:
                assert (await conn.call(*METADATA)).brokers
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.5 * LIFETIME_MS / 1000)  # past the session's end: renewed before the next request
            assert (await conn.call(*METADATA)).brokers
            return local
        finally:
            conn.close()

    local = asyncio.run(run())
    assert sessions_of(broker, local, f"User:{user}") >= 5
    assert not [line for line in broker.stderr_lines if "SASL session expired" in line]


def test_blocking_connection_renews_its_session(broker):
    security = ClientSecurity(sasl_mechanism="PLAIN", username="alice", password="alice-secret")
    with Connection("127.0.0.1", broker.ports["SASL_PLAINTEXT"], security=security) as conn:
        local = conn.sock.getsockname()
        for _ in range(3):
            assert conn.call(*METADATA).brokers
            time.sleep(1.2 * LIFETIME_MS / 1000)
        assert conn.call(*METADATA).brokers
    assert sessions_of(broker, local, "User:alice") == 4
    assert not [line for line in broker.stderr_lines if "SASL session expired" in line]
