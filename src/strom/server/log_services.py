"""The log lifecycle services of a broker, kept out of broker.py: the log cleaner, the flusher,
the high-watermark and recovery-point checkpoints, and applying config changes (topic or
dynamic broker configs) to live logs without a restart.

Everything here runs on the broker's event loop; the blocking parts (cleaning, fsync,
checkpoint writes) are handed to worker threads by the services themselves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from strom.config.broker import BrokerConfig
from strom.config.dynamic import DEFAULT_ENTITY
from strom.log.cleaner import LogCleaner
from strom.log.manager import stable_items
from strom.metrics.stats import Histogram
from strom.server.scheduler import NEVER_MS

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
FLUSH_CHECK_FALLBACK_MS = 1000


class LogServices:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.log_manager = broker.log_manager
        self.cleaner = LogCleaner(
            self.log_manager,
            lambda: self.broker.config.cleaner_config(),
            stable_offset=self._high_watermark,
            producer_last_offsets=self._producer_last_offsets,
        )
        self.log_manager.high_watermarks = self._high_watermarks
        self.log_manager.high_watermarks_version = lambda: self.broker.replica_manager.hw_clock[0]
        self.flush_time = Histogram()  # LogFlushRateAndTimeMs
        self.log_manager.flusher.observe_flush = self.flush_time.observe
        # Until start(), logs the controller asks for belong to existing partitions.
        self.log_manager.new_logs_expected = False
        self.log_manager.cordoned_dirs = set(broker.config.cordoned_log_dirs)

    # -- start and stop

    def load_dynamic_config(self) -> None:
        """Apply the dynamic broker configs stored in the metadata (before logs are served)."""
        dynamic = self.broker.dynamic_config
        # A stored config the broker cannot take is left out and named: it must never keep
        # the broker from starting and serving (dynamic.py).
        for refused in dynamic.load(self.broker.broker_configs(DEFAULT_ENTITY),
                                    self.broker.broker_configs(str(self.broker.broker_id))):
            log.error("ignoring the stored dynamic broker config %s", refused)
        if dynamic.default or dynamic.per_broker or self.broker.config is not dynamic.static:
            try:
                self.apply_broker_config(dynamic.effective())
            except ValueError as e:
                log.error("ignoring the stored dynamic broker configs: %s", e)
                dynamic.default.clear()
                dynamic.per_broker.clear()

    def start(self) -> None:
        config = self.broker.config
        self.log_manager.new_logs_expected = True
        self.log_manager.flusher.start()
        self.cleaner.startup()
        interval = config["log.flush.scheduler.interval.ms"]
        self.broker.scheduler.schedule("log-flusher", interval if interval < NEVER_MS else FLUSH_CHECK_FALLBACK_MS,
                                       self._check_flush_ms)
        self.broker.scheduler.schedule("highwatermark-checkpoint",
                                       config["replica.high.watermark.checkpoint.interval.ms"],
                                       self._checkpoint_high_watermarks)

    async def stop(self) -> None:
        """Abort cleaning (a pass in progress leaves only `.cleaned` files, removed at the next
        start) and stop the flusher; the log manager's shutdown flushes everything."""
        await self.cleaner.shutdown()
        await self.cleaner.write_checkpoints()
        await self.log_manager.flusher.stop()

    # -- scheduled work

    def _check_flush_ms(self) -> None:
        self.log_manager.flusher.check_flush_ms(self.log_manager.unflushed_logs())

    async def checkpoint_recovery_points(self) -> None:
        """Each log's recovery point, after the producer snapshots up to it."""
        await self.broker.producer_states.snapshot()
        await asyncio.to_thread(self.log_manager.checkpoint)

    async def _checkpoint_high_watermarks(self) -> None:
        await asyncio.to_thread(self.log_manager.checkpoint_high_watermarks)

    def _high_watermarks(self) -> dict[TopicPartition, int]:
        return {tp: p.high_watermark for tp, p in stable_items(self.broker.replica_manager.partitions)}

    def _high_watermark(self, tp: TopicPartition) -> int | None:
        partition = self.broker.replica_manager.partitions.get(tp)
        return None if partition is None else partition.high_watermark

    def _producer_last_offsets(self, tp: TopicPartition) -> Mapping[int, int]:
        partition = self.broker.replica_manager.partitions.get(tp)
        if partition is None:
            return {}
        state = partition.producer_state
        return {pid: e.batches[-1].last_offset for pid, e in state.producers.items() if e.batches}

    # -- configs applied without restart

    def apply_broker_config(self, effective: BrokerConfig) -> None:
        """Make `effective` the broker's config: new topic defaults for every log (under its
        topic's overrides), cleaner settings, min.insync.replicas, message.max.bytes, ..."""
        broker = self.broker
        broker.config = effective
        broker.default_log_config = effective.default_log_config()
        self.log_manager.default_config = broker.default_log_config
        self.log_manager.cordoned_dirs = set(effective.cordoned_log_dirs)
        for (topic, _), lg in self.log_manager.logs():
            lg.config = broker.log_config_for(topic)
        self.cleaner.reconfigure()

    def topic_config_changed(self, topic: str) -> None:
        config = self.broker.log_config_for(topic)
        for (name, _), lg in self.log_manager.logs():
            if name == topic:
                lg.config = config
        self.cleaner.wake()  # e.g. cleanup.policy became compact
