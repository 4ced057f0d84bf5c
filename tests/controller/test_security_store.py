"""ACLs and delegation tokens through StoreSecurityMetadata: what one broker writes, another
sharing the store reads at start-up and follows afterwards; the nodes are Kafka's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from strom.config.broker import BrokerConfig
from strom.controller import znodes
from strom.controller.security_store import StoreSecurityMetadata
from strom.controller.store import LocalMetadataStore
from strom.security.authorizer import ALLOW, DENY, LITERAL, PREFIXED, READ, TOPIC, Acl, Authorizer
from strom.security.delegation_tokens import DelegationTokens


async def _io(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


def _store(tmp_path: Path) -> StoreSecurityMetadata:
    store = LocalMetadataStore(tmp_path / "metadata.json")
    for path in znodes.PERSISTENT_PATHS:
        store.create(path)
    return StoreSecurityMetadata(store, _io)


async def _until(check: Any) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not seen in time")


def test_acls_written_by_one_authorizer_reach_another(tmp_path: Path) -> None:
    store = _store(tmp_path)
    alice = Acl("User:alice", "*", READ, ALLOW)
    bob = Acl("User:bob", "*", READ, DENY)

    async def run() -> None:
        writer, reader = (Authorizer(store, "", allow_if_no_acl=False) for _ in range(2))
        writer.change((TOPIC, LITERAL, "t"), [alice])
        reader.load()  # at start-up: what is stored, and no announcement handed again
        assert reader.acls == {(TOPIC, LITERAL, "t"): frozenset({alice})}
        await reader.start()
        writer.change((TOPIC, PREFIXED, "p-"), [bob])
        await _until(lambda: (TOPIC, PREFIXED, "p-") in reader.acls)
        writer.change((TOPIC, LITERAL, "t"), (), [alice])
        await _until(lambda: (TOPIC, LITERAL, "t") not in reader.acls)
        reader.stop()
        assert reader.acls == writer.acls == {(TOPIC, PREFIXED, "p-"): frozenset({bob})}

    asyncio.run(run())
    assert store.store.get(f"{znodes.ACL_LITERAL}/Topic/t") is None
    assert store.store.get(f"{znodes.ACL_PREFIXED}/Topic/p-")[0] == {"version": 1, "acls": [bob.encode()]}
    assert [store.store.get(f"{znodes.ACL_CHANGES}/{c}")[0] for c in store.store.children(znodes.ACL_CHANGES)] == [
        "Topic:t", "Topic:t"]


def test_tokens_written_by_one_broker_reach_another(tmp_path: Path) -> None:
    store = _store(tmp_path)
    config = BrokerConfig({"delegation.token.secret.key": "s3cret"})

    async def run() -> None:
        writer, reader = DelegationTokens(store, config), DelegationTokens(store, config)
        first, _ = writer.create("User:alice", "User:alice", [], -1)
        reader.load()
        assert reader.tokens[first.token_id].info == first
        await reader.start()
        second, hmac = writer.create("User:bob", "User:bob", [], -1)
        await _until(lambda: second.token_id in reader.tokens)
        writer.expire("User:bob", hmac, -1)
        await _until(lambda: second.token_id not in reader.tokens)
        reader.stop()
        assert set(reader.tokens) == set(writer.tokens) == {first.token_id}

    asyncio.run(run())
    assert store.token_ids() == [store.store.children(znodes.TOKENS)[0]]
