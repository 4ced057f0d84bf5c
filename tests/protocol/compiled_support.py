"""What the compiled request parsers' tests share: a good frame damaged every way a test
asks, and the check that the compiled parser never accepts what the Python one refuses."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from strom.protocol import messages


def agrees_on_damage(good: bytearray, seed: int, changes: int, same: Callable[[Any, Any], None]) -> int:
    """Every truncation of `good` and `changes` copies with one to three bytes changed: the
    compiled parser answers None (left to Python, which names the fault) or what the Python
    parser makes (`same` asserts it). Returns how many it accepted."""
    rng = random.Random(seed)
    frames = [good[:cut] for cut in range(len(good))]
    for _ in range(changes):
        frame = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            frame[rng.randrange(len(frame))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        frames.append(frame)
    accepted = 0
    for frame in frames:
        compiled = messages._parse_compiled(bytearray(frame))
        try:
            python = messages.parse_request_py(bytearray(frame))
        except (messages.InvalidRequest, messages.UnsupportedRequest):
            assert compiled is None, frame
            continue
        if compiled is not None:
            accepted += 1
            same(compiled, python)
    return accepted
