"""Which broker configs set the default of each topic config (Kafka's synonyms): read by
the broker config's messages about a topic key given to a broker, and by DescribeConfigs."""

from __future__ import annotations

# Topic config -> the broker configs that set its default, highest precedence first.
BROKER_SYNONYMS: dict[str, tuple[str, ...]] = {
    "segment.bytes": ("log.segment.bytes",),
    "segment.ms": ("log.roll.ms", "log.roll.hours"),
    "retention.ms": ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
    "retention.bytes": ("log.retention.bytes",),
    "index.interval.bytes": ("log.index.interval.bytes", "index.interval.bytes"),
    "segment.index.bytes": ("log.index.size.max.bytes",),
    "max.message.bytes": ("message.max.bytes",),
    "message.timestamp.type": ("log.message.timestamp.type",),
    "file.delete.delay.ms": ("log.segment.delete.delay.ms",),
    "cleanup.policy": ("log.cleanup.policy",),
    "delete.retention.ms": ("log.cleaner.delete.retention.ms",),
    "min.cleanable.dirty.ratio": ("log.cleaner.min.cleanable.ratio",),
    "min.compaction.lag.ms": ("log.cleaner.min.compaction.lag.ms",),
    "max.compaction.lag.ms": ("log.cleaner.max.compaction.lag.ms",),
    "flush.messages": ("log.flush.interval.messages",),
    "flush.ms": ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
    "min.insync.replicas": ("min.insync.replicas",),
    "unclean.leader.election.enable": ("unclean.leader.election.enable",),
    "compression.type": ("compression.type",),
    "compression.gzip.level": ("compression.gzip.level",),
    "compression.lz4.level": ("compression.lz4.level",),
    "compression.zstd.level": ("compression.zstd.level",),
    "message.timestamp.before.max.ms": ("log.message.timestamp.before.max.ms",),
    "message.timestamp.after.max.ms": ("log.message.timestamp.after.max.ms",),
    "segment.jitter.ms": ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    "preallocate": ("log.preallocate",),
    "local.retention.ms": ("log.local.retention.ms",),
    "local.retention.bytes": ("log.local.retention.bytes",),
}
