"""A quorum controller on a one-voter KRaft quorum in a directory, in this process: what the
controller tests drive without sockets (the voter sends nothing)."""

from __future__ import annotations

import asyncio
import random

from strom.controller.quorum_controller import ControllerSettings, QuorumController
from strom.controller.replication_control import Limits
from strom.protocol.raft_records import Endpoint, VoterEntry
from strom.raft.config import QuorumConfig
from strom.raft.driver import RaftDriver

FEATURES = {"metadata.version": 25, "group.version": 1, "transaction.version": 2}


async def start_controller(directory, *, features: dict[str, int] = FEATURES, limits: Limits | None = None,
                           session_ms: int = 600_000, snapshot_bytes: int = 20 << 20, tokens=None,
                           token_check_s: float = 3600.0) -> QuorumController:
    """The controller, once active with its features finalized."""
    config = QuorumConfig(node_id=1, voters=(VoterEntry(1, None, (Endpoint("CONTROLLER", "127.0.0.1", 1),)),),
                          cluster_id="c1", max_bytes_between_snapshots=snapshot_bytes)

    async def nowhere(*_args):
        raise ConnectionError("a one-voter quorum sends nothing")

    driver = RaftDriver(config, directory, nowhere, rng=random.Random(1))
    settings = ControllerSettings(1, "c1", limits or Limits(), session_ms, features, token_expiry_check_s=token_check_s)
    if tokens is not None:
        settings.tokens = tokens
    controller = QuorumController(settings, driver)
    controller.start()
    await driver.start()
    for _ in range(500):
        if controller.active and controller.image.features:
            return controller
        await asyncio.sleep(0.01)
    raise AssertionError("the controller did not become active")


async def stop_controller(controller: QuorumController) -> None:
    await controller.close()
    await controller.driver.close()
