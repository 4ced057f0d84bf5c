"""A KRaft cluster whose controller quorum has no leader (its only controller stopped): the
broker keeps serving the data it leads, and what needs the controller says that the quorum has
no leader, with Kafka's error codes, not "the client's metadata is out of date"."""

from __future__ import annotations

import asyncio
import threading

import pytest
from tests.cli.conftest import fails

from strom.config.broker import BrokerConfig
from strom.protocol.errors import ErrorCode, KafkaError
from strom.server.kraft import forwarding
from strom.server.kraft.controller_channel import ControllerChannel
from strom.testing import KRaftQuorum, create_topic, produce_acked, read_values, unique_name


@pytest.fixture(scope="module")
def headless():
    """One controller and one broker; the controller stopped once the broker has a topic."""
    with KRaftQuorum(1, brokers=1) as quorum:
        topic = unique_name("kept")
        create_topic(quorum.bootstrap, topic)
        quorum.nodes[1].close()
        yield quorum, topic


def test_the_broker_keeps_serving_its_partitions(headless):
    quorum, topic = headless
    produce_acked(quorum.bootstrap, topic, [b"after"])
    assert read_values(quorum.bootstrap, topic, 1) == [b"after"]


def test_metadata_quorum_names_kafkas_error_not_stale_client_metadata(headless):
    quorum, _ = headless
    line = fails("metadata-quorum", "--bootstrap-server", quorum.bootstrap, "describe", "--status")
    assert "the controller quorum has no leader" in line and "NOT_LEADER_OR_FOLLOWER" in line
    assert "is not the current leader" in line
    assert "out of date" not in line


def test_a_forwarded_request_times_out_as_kafkas_broker_answers(headless, monkeypatch):
    """The broker's forwarding (ForwardingTopicAdmin over a real controller channel to the
    stopped controller) answers REQUEST_TIMED_OUT, Kafka's ForwardingManager's code, saying the
    quorum has no leader. The deadline is shortened here: the broker waits 30 s."""
    quorum, _ = headless
    monkeypatch.setattr(forwarding, "TIMEOUT_S", 1.0)
    config = BrokerConfig({"process.roles": "broker", "node.id": "100", "controller.listener.names": "CONTROLLER",
                           "controller.quorum.voters": quorum.voters})
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    channel = ControllerChannel(config, "lost-quorum-test", None)
    try:
        admin = forwarding.ForwardingTopicAdmin(channel, loop, image=lambda: None)
        with pytest.raises(KafkaError) as raised:
            admin.create_topic(unique_name("never"), 1, 1, None, {})
    finally:
        channel.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    assert raised.value.code == ErrorCode.REQUEST_TIMED_OUT
    assert "controller quorum has no leader" in str(raised.value)
