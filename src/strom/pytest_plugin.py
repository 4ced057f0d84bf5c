"""pytest fixtures for testing an application against a real Kafka-compatible broker.

Installed with Strom and registered as a pytest plugin (entry point `pytest11`), so any test
can ask for `strom_broker`: a real `strom serve` process on 127.0.0.1 with an ephemeral port
and a temporary data directory, started once per session (no JVM, no container: it is ready
in a fraction of a second) and stopped at the end. Any Kafka client connects to
`strom_broker.bootstrap`. Override the `strom_broker_config` fixture to pass broker configs
(Kafka's names), e.g. `{"num.partitions": "3"}`; like the broker it configures, the override
is session-scoped (`@pytest.fixture(scope="session")`).
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

with warnings.catch_warnings():
    # kafka-python 3 reads each protocol schema it defines through importlib.resources'
    # deprecated read_text, when its modules are first imported: some 300 DeprecationWarnings,
    # none of them about the project whose tests use this plugin.
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka

    from strom.client import Connection
    from strom.testing import BrokerProcess

    # Strom defers kafka-python's package __init__ (its client) to the first use; the tests
    # this plugin serves are likely that use: run it here, where its warnings are silenced.
    hasattr(kafka, "KafkaProducer")

CREATE_TOPICS = 19
TOPIC_ALREADY_EXISTS = 36


@dataclass
class StromBroker:
    """A running broker: where to connect, and a way to make topics."""

    process: BrokerProcess

    @property
    def bootstrap(self) -> str:
        """`host:port` for a client's bootstrap servers."""
        return self.process.bootstrap

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None,
                     *, exist_ok: bool = False) -> str:
        """Create topic `name` (CreateTopics, waiting for its leaders); returns the name."""
        with Connection("127.0.0.1", self.process.port) as conn:
            body = conn.call(CREATE_TOPICS, 5, {
                "topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                            "assignments": [],
                            "configs": [{"name": k, "value": v} for k, v in (config or {}).items()]}],
                "timeout_ms": 30_000, "validate_only": False})
        result = body.topics[0]
        if result.error_code and not (exist_ok and result.error_code == TOPIC_ALREADY_EXISTS):
            raise RuntimeError(f"cannot create topic {name}: error {result.error_code} "
                               f"({result.error_message})")
        return name

    def new_topic(self, prefix: str = "topic", partitions: int = 1,
                  config: dict[str, str] | None = None) -> str:
        """A topic with a name no other test uses, so tests sharing the broker stay apart."""
        return self.create_topic(f"{prefix}-{uuid.uuid4().hex[:10]}", partitions, config)


@pytest.fixture(scope="session")
def strom_broker_config() -> dict[str, str]:
    """Broker configs for `strom_broker`. Override it in a conftest.py, session-scoped as the
    broker is: `@pytest.fixture(scope="session")` over a function returning Kafka config names
    and values."""
    return {}


@pytest.fixture(scope="session")
def strom_broker(strom_broker_config: dict[str, str],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[StromBroker]:
    """A Strom broker for the whole test session."""
    with BrokerProcess(data_dir=tmp_path_factory.mktemp("strom-broker"),
                       overrides=strom_broker_config) as process:
        yield StromBroker(process)
