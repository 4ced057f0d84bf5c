"""Strom: a Kafka-compatible distributed commit log."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any


def _defer_kafka_python_init() -> None:
    """Strom uses kafka-python's protocol and record codecs, but the package's __init__ imports
    its whole client first (admin, consumer, producer, networking): about 100 ms of every
    broker's and every command's start. The package is registered without running it; the
    first attribute asked of it that is not a submodule (a user's `from kafka import
    KafkaProducer`, `kafka.__version__`) runs it then, so code that uses the client sees no
    difference."""
    if "kafka" in sys.modules:
        return
    spec = importlib.util.find_spec("kafka")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)

    def run_init(name: str) -> Any:
        del package.__getattr__  # once: the real __init__ defines what is asked for, or not
        spec.loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = run_init
    sys.modules["kafka"] = package


_defer_kafka_python_init()
