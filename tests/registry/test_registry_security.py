"""The schema registry's security on one broker with SASL users and the ACL authorizer: an
https listener with the broker's keystore, HTTP basic auth against PLAIN (JAAS) and SCRAM users,
and subjects guarded by the ACLs of the topic they name (TopicNameStrategy), the global config
by the cluster's DESCRIBE_CONFIGS / ALTER_CONFIGS."""

from __future__ import annotations

import json

import pytest
import requests
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError

from strom.testing import BrokerProcess, acl_broker_overrides, free_ports, make_pki, unique_name

CT = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
SCHEMA = json.dumps({"type": "record", "name": "S", "fields": [{"name": "a", "type": "int"}]})


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(pki, tmp_path_factory):
    port = free_ports(1)[0]
    overrides = acl_broker_overrides(["admin", "alice"], {
        "schema.registry.listeners": f"https://127.0.0.1:{port}",
        "schema.registry.authentication.method": "BASIC",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki["server"])})
    with BrokerProcess(tmp_path_factory.mktemp("secure-registry"), overrides) as b:
        b.registry_url = f"https://127.0.0.1:{port}"
        b.admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}",
                               "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                               "sasl.username": "admin", "sasl.password": "admin-secret"})
        # The registry reads and writes its topic over the broker's own connections: on the
        # embedded broker those are its PLAINTEXT listener's, whose principal is User:ANONYMOUS.
        for operation in (AclOperation.READ, AclOperation.WRITE):
            grant(b, "_schemas", operation, "User:ANONYMOUS")
        yield b


def call(broker, pki, method: str, path: str, user: str | None, password: str | None = None, **kw):
    auth = (user, password or f"{user}-secret") if user else None
    return requests.request(method, broker.registry_url + path, auth=auth, verify=str(pki["ca"]), headers=CT,
                            timeout=30, **kw)


def grant(broker, topic: str, operation: AclOperation, principal: str = "User:alice") -> None:
    binding = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, principal, "*", operation,
                         AclPermissionType.ALLOW)
    for future in broker.admin.create_acls([binding], request_timeout=15).values():
        future.result(15)


def test_who_without_credentials_or_with_wrong_ones_gets_401(broker, pki):
    for user, password in ((None, None), ("alice", "wrong"), ("nobody", "x")):
        answer = call(broker, pki, "get", "/subjects", user, password)
        assert answer.status_code == 401 and answer.json()["error_code"] == 40101
        assert answer.headers["WWW-Authenticate"].startswith("Basic")
    assert call(broker, pki, "get", "/schemas/types", "alice").status_code == 200


def test_subjects_follow_the_acls_of_their_topic(broker, pki):
    topic = unique_name("guarded")
    subject = f"{topic}-value"
    assert call(broker, pki, "post", f"/subjects/{subject}/versions", "admin", json={"schema": SCHEMA}).status_code == 200
    denied = call(broker, pki, "get", f"/subjects/{subject}/versions", "alice")
    assert denied.status_code == 403 and denied.json()["error_code"] == 40301
    assert subject not in call(broker, pki, "get", "/subjects", "alice").json()
    assert subject in call(broker, pki, "get", "/subjects", "admin").json()
    grant(broker, topic, AclOperation.READ)
    assert call(broker, pki, "get", f"/subjects/{subject}/versions", "alice").json() == [1]
    assert subject in call(broker, pki, "get", "/subjects", "alice").json()
    schema_id = call(broker, pki, "get", f"/subjects/{subject}/versions/1", "alice").json()["id"]
    assert call(broker, pki, "get", f"/schemas/ids/{schema_id}", "alice").status_code == 200
    other = {"schema": json.dumps({"type": "record", "name": "S", "fields": [
        {"name": "a", "type": "int"}, {"name": "b", "type": "int", "default": 0}]})}
    assert call(broker, pki, "post", f"/subjects/{subject}/versions", "alice", json=other).status_code == 403
    grant(broker, topic, AclOperation.WRITE)
    # the confluent client, unchanged, with basic auth over TLS
    client = SchemaRegistryClient({"url": broker.registry_url, "basic.auth.user.info": "alice:alice-secret",
                                   "ssl.ca.location": str(pki["ca"])})
    with pytest.raises(SchemaRegistryError) as info:  # BACKWARD: a field without a default
        client.register_schema(subject, Schema(json.dumps({"type": "record", "name": "S", "fields": [
            {"name": "a", "type": "int"}, {"name": "c", "type": "int"}]}), "AVRO"))
    assert info.value.error_code == 409
    assert client.register_schema(subject, Schema(other["schema"], "AVRO")) > schema_id
    # the global config is the cluster's
    assert call(broker, pki, "put", "/config", "alice", json={"compatibility": "NONE"}).status_code == 403
    assert call(broker, pki, "get", "/config", "alice").status_code == 403
    assert call(broker, pki, "get", "/config", "admin").json() == {"compatibilityLevel": "BACKWARD"}


def test_scram_users_authenticate_too(broker, pki):
    upsert = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                          b"carol-pw")
    for future in broker.admin.alter_user_scram_credentials([upsert], request_timeout=15).values():
        future.result(15)
    assert call(broker, pki, "get", "/schemas/types", "carol", "carol-pw").status_code == 200
    assert call(broker, pki, "get", "/schemas/types", "carol", "carol-wrong").status_code == 401
