"""What a controller asks of the principal behind each request on its listener (Kafka's
ControllerApis): CLUSTER_ACTION for the quorum's and brokers' own traffic, ALTER or DESCRIBE
for the cluster-wide admin requests, per-topic operations for topic requests, and the same for
a request a broker forwarded in an Envelope, checked as the client's. ACLs come from the
controller's metadata image."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from strom.metadata import records as r
from strom.metadata.image import MetadataImage
from strom.network.request import RequestContext
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import REQUESTS, RequestHeader, build, encode_body
from strom.security.authorizer import (
    ALLOW,
    CLUSTER,
    CREATE,
    DESCRIBE,
    LITERAL,
    PREFIXED,
    TOPIC,
    Authorizer,
)
from strom.server.kraft import envelope
from strom.server.kraft.controller_apis import (
    CLUSTER_OPERATION,
    VERSIONS,
    ControllerApis,
    error_answer,
)

DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
FETCH, VOTE, DESCRIBE_QUORUM, CREATE_TOPICS, CREATE_ACLS, BROKER_HEARTBEAT, ENVELOPE = 1, 52, 55, 19, 30, 63, 58


class _Driver:
    def __init__(self) -> None:
        self.asked: list[int] = []

    async def handle_request(self, api_key: int, version: int, body) -> dict:
        self.asked.append(api_key)
        return {"error_code": 0}


class _Controller:
    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self.active = True
        self.settings = SimpleNamespace(limits=None)
        self.writes: list[str] = []

    async def write(self, name: str, op):
        self.writes.append(name)
        return {}


def _acl(principal: str, operation: int, resource_type: int, name: str, pattern: int = LITERAL):
    return r.AccessControlEntryRecord(id=uuid.uuid4(), resource_type=resource_type, resource_name=name,
                                      pattern_type=pattern, principal=principal, host="*", operation=operation,
                                      permission_type=ALLOW)


def _apis(*acls) -> tuple[ControllerApis, _Driver, _Controller]:
    image = MetadataImage()
    for acl in acls:
        image.replay(acl)
    authorizer = Authorizer(None, "User:broker", allow_if_no_acl=False)
    authorizer.replace_acls(image.acls.values())
    server = SimpleNamespace(authorizer=authorizer, cluster_id="c")
    driver, controller = _Driver(), _Controller(image)
    return ControllerApis(server, controller, driver), driver, controller


def _ctx(key: int, version: int, principal: str) -> RequestContext:
    return RequestContext(RequestHeader(key, version, 1, "c", True), "CONTROLLER", "127.0.0.1:5000", principal)


def _request(key: int, version: int, fields: dict):
    cls = REQUESTS[key]
    return cls.decode(build(cls, version, fields).encode(version=version), version=version)


def test_the_quorum_and_brokers_need_cluster_action():
    apis, driver, _ = _apis()
    for key, version in ((FETCH, 16), (VOTE, 1)):
        anonymous = asyncio.run(apis.handle(_ctx(key, version, "User:ANONYMOUS"), None))
        assert anonymous == {"error_code": DENIED}
        assert asyncio.run(apis.handle(_ctx(key, version, "User:broker"), None)) == {"error_code": 0}
    assert driver.asked == [FETCH, VOTE]  # only the super user's reached Raft


def test_an_acl_in_the_image_grants_describe_quorum():
    apis, driver, _ = _apis(_acl("User:carol", DESCRIBE, CLUSTER, "kafka-cluster"))
    assert asyncio.run(apis.handle(_ctx(DESCRIBE_QUORUM, 1, "User:carol"), None)) == {"error_code": 0}
    assert asyncio.run(apis.handle(_ctx(DESCRIBE_QUORUM, 1, "User:alice"), None)) == {"error_code": DENIED}
    assert driver.asked == [DESCRIBE_QUORUM]


def test_a_refused_admin_request_fails_every_item():
    apis, _, controller = _apis()
    body = _request(CREATE_ACLS, 3, {"creations": [
        {"resource_type": 2, "resource_name": n, "resource_pattern_type": 3, "principal": "User:x", "host": "*",
         "operation": 3, "permission_type": 3} for n in ("a", "b")]})
    answer = asyncio.run(apis.handle(_ctx(CREATE_ACLS, 3, "User:alice"), body))
    assert [x["error_code"] for x in answer["results"]] == [DENIED, DENIED]
    assert controller.writes == []


def test_topics_are_authorized_one_by_one_even_when_forwarded():
    apis, _, controller = _apis(_acl("User:alice", CREATE, TOPIC, "alice-", PREFIXED))
    body = {"topics": [{"name": n, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
                       for n in ("alice-orders", "payments")], "timeout_ms": 1000, "validate_only": False}
    # From a broker, in an Envelope carrying alice's request: checked as hers, not the broker's.
    client = _ctx(CREATE_TOPICS, 7, "User:alice")
    wrapped = _request(ENVELOPE, 0, envelope.wrap(client, body))
    answer = asyncio.run(apis.handle(_ctx(ENVELOPE, 0, "User:broker"), wrapped))
    assert answer["error_code"] == ErrorCode.NONE
    topics = {t.name: t.error_code for t in envelope.unwrap_response(client, answer["response_data"]).topics}
    assert topics == {"alice-orders": ErrorCode.NONE, "payments": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    assert controller.writes == ["create-topics"]
    # An envelope from a principal without CLUSTER_ACTION is refused whole.
    refused = asyncio.run(apis.handle(_ctx(ENVELOPE, 0, "User:alice"), wrapped))
    assert refused["error_code"] == DENIED


@pytest.mark.parametrize("key", sorted(CLUSTER_OPERATION))
def test_every_refusal_encodes_at_every_version(key):
    lo, hi = VERSIONS[key]
    for version in range(lo, hi + 1):
        request = _request(key, version, _fields(key)) if _fields(key) else None  # read only for items
        assert encode_body(key, version, error_answer(key, version, request, DENIED, "no"))


def _fields(key: int) -> dict:
    """A request of `key` with one item where it has a list of them."""
    return {CREATE_ACLS: {"creations": [{"resource_type": 2, "resource_name": "t", "resource_pattern_type": 3,
                                         "principal": "User:x", "host": "*", "operation": 3, "permission_type": 3}]},
            31: {"filters": [{"resource_type_filter": 2, "resource_name_filter": None, "pattern_type_filter": 1,
                              "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}]},
            49: {"entries": [{"entity": [{"entity_type": "user", "entity_name": "u"}], "ops": []}],
                 "validate_only": False},
            51: {"deletions": [{"name": "u", "mechanism": 1}], "upsertions": []},
            43: {"election_type": 0, "topic_partitions": [{"topic": "t", "partitions": [0, 1]}], "timeout_ms": 1}
            }.get(key, {})
