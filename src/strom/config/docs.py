"""The `documentation` DescribeConfigs (v3+) returns for each topic and broker config when a
request sets include_documentation, as a Kafka broker does.

Descriptions say what a setting does in Strom, which is what it does in Kafka; settings Strom
accepts and ignores say so. Some names are both a topic config and a broker config (the broker
one then sets the default for topics): `doc(name, broker=True)` answers the broker's meaning.
Client metrics subscriptions document themselves (`client_telemetry.CONFIG_DOCS`).
"""

from __future__ import annotations

_LONG_MAX = "Long.MAX_VALUE (9223372036854775807)"

# Topic configs (strom.log.config.TOPIC_CONFIG_KEYS), and the deprecated keys it accepts.
TOPIC_DOCS: dict[str, str] = {
    "segment.bytes":
        "Size in bytes at which a partition's active log segment is closed and a new one started. "
        "Retention and compaction act on whole segments, so smaller segments release old data "
        "sooner at the cost of more files.",
    "segment.ms":
        "Age in milliseconds after which the active segment is rolled even if it has not reached "
        "segment.bytes, so that retention and compaction also reach data in quiet partitions.",
    "segment.jitter.ms":
        "Largest random amount, in milliseconds, taken off segment.ms for each new segment so that "
        "partitions created together do not all roll at the same moment; 0 means no jitter.",
    "segment.index.bytes":
        "Maximum size in bytes of a segment's offset index and time index; once an index is full "
        "the segment is rolled.",
    "index.interval.bytes":
        "Bytes of records appended between two entries of a segment's offset and time indexes. A "
        "smaller interval makes lookups by offset or timestamp land closer to the target and makes "
        "the indexes bigger.",
    "retention.ms":
        "How long, in milliseconds, records are kept before the segment holding them may be "
        "deleted (with the delete cleanup policy); -1 keeps records however old they are.",
    "retention.bytes":
        "Size in bytes a partition's log may reach (with the delete cleanup policy) before its "
        "oldest segments are deleted to bring it back under; -1 means no size limit.",
    "local.retention.ms":
        "How long a tiered topic's segments stay on the broker's disk once they are copied to "
        "remote storage (a segment is never deleted locally before it is copied); -2, the "
        "default, means the same as retention.ms, which bounds the whole log, remote part included.",
    "local.retention.bytes":
        "How many bytes of a tiered topic's partition stay on the broker's disk (only segments "
        "already copied to remote storage are deleted for it); -2, the default, means the same "
        "as retention.bytes.",
    "remote.storage.enable":
        "Whether the topic's closed segments are copied to remote storage (tiered storage, "
        "KIP-405) and read back from there once deleted locally. Needs "
        "remote.log.storage.system.enable on the brokers; refused for compacted topics. Turning "
        "it off again requires remote.log.copy.disable and remote.log.delete.on.disable.",
    "remote.log.copy.disable":
        "Stop copying the topic's segments to remote storage while keeping what is there "
        "readable (KIP-950): local segments then stay until retention.* deletes them.",
    "remote.log.delete.on.disable":
        "Delete the topic's remote data when remote.storage.enable is turned off (KIP-950); "
        "turning it off is refused without it.",
    "errors.deadletterqueue.group.enable":
        "Whether share groups may write their dead letters to this topic (KIP-1191): a group's "
        "errors.deadletterqueue.topic.name must name a topic that opts in.",
    "confluent.value.schema.validation":
        "Refuse a produce whose records' values are not framed with a schema id (magic byte 0 and "
        "a 4-byte id) registered in the broker's schema registry for the value's subject "
        "(confluent.value.subject.name.strategy): INVALID_RECORD naming each record, nothing of "
        "the batch written. Needs schema.registry.listeners on the brokers. Null values pass.",
    "confluent.key.schema.validation":
        "As confluent.value.schema.validation, for the records' keys. Null keys pass.",
    "confluent.value.subject.name.strategy":
        "The subject a value's schema id must be registered under: TopicNameStrategy "
        "(<topic>-value, the default), RecordNameStrategy (the schema's record name) or "
        "TopicRecordNameStrategy (<topic>-<record name>), by short or full class name.",
    "confluent.key.subject.name.strategy":
        "As confluent.value.subject.name.strategy, for keys (<topic>-key by default).",
    "iceberg.mode":
        "How the topic's committed records become rows of the Iceberg table <iceberg.namespace>.<topic>: "
        "disabled (the default), key_value (partition, offset, timestamp, timestamp_type, key, value, "
        "headers). value_schema_id_prefix and value_schema_latest are not yet supported. Needs "
        "iceberg.enabled on the brokers.",
    "iceberg.partition.spec":
        "The partition spec of the topic's Iceberg table when Strom creates it: a parenthesized list "
        "of columns or year/month/day/hour(timestamp), such as (hour(timestamp)), the default, or () "
        "for an unpartitioned table.",
    "iceberg.table.properties":
        "Extra properties of the topic's Iceberg table when Strom creates it, as k=v,k2=v2 (the "
        "strom. prefix is Strom's own).",
    "max.message.bytes":
        "Largest record batch, in bytes as sent (after compression), the broker accepts for this "
        "topic; a produce with a bigger batch is refused.",
    "message.timestamp.type":
        "Which timestamp stored records carry: CreateTime keeps the one the producer set, "
        "LogAppendTime replaces it with the broker's clock when the batch is appended.",
    "message.timestamp.before.max.ms":
        "With CreateTime, how many milliseconds a record's timestamp may lie behind the broker's "
        f"clock; an older one is refused with INVALID_TIMESTAMP. {_LONG_MAX}, the default, turns "
        "the check off.",
    "message.timestamp.after.max.ms":
        "With CreateTime, how many milliseconds a record's timestamp may lie ahead of the broker's "
        "clock before the record is refused with INVALID_TIMESTAMP; the default is one hour.",
    "file.delete.delay.ms":
        "How long, in milliseconds, the files of a segment removed by retention or compaction are "
        "kept before they are deleted from disk, so that reads already under way can finish.",
    "cleanup.policy":
        "How old data leaves the log: delete removes whole segments past retention.ms or "
        "retention.bytes, compact keeps the latest record of every key, and compact,delete does "
        "both.",
    "delete.retention.ms":
        "On a compacted topic, how long in milliseconds a tombstone (a record with a null value) "
        "stays readable once compaction reaches it, so that consumers get to see the deletion "
        "before the key disappears.",
    "min.cleanable.dirty.ratio":
        "Compaction of a log starts when the part not compacted yet makes up at least this "
        "fraction (0 to 1) of it; a lower ratio compacts more often and leaves fewer duplicate "
        "keys.",
    "min.compaction.lag.ms":
        "Milliseconds a record must have been in the log before compaction may drop it for a newer "
        "record with the same key; 0 lets compaction take any record.",
    "max.compaction.lag.ms":
        "Longest time, in milliseconds, a record may stay uncompacted: a log holding dirty records "
        "this old is compacted even below min.cleanable.dirty.ratio.",
    "flush.messages":
        "Records appended to a partition after which the broker fsyncs its log. The default, "
        f"{_LONG_MAX}, never forces a flush and leaves durability to replication and the "
        "operating system.",
    "flush.ms":
        "Milliseconds since a partition's log was last fsynced after which the broker fsyncs it "
        f"again. The default, {_LONG_MAX}, never forces a flush.",
    "min.insync.replicas":
        "For a produce with acks=all, the fewest in-sync replicas (the leader counts) that must "
        "have the write; with fewer in sync it fails with NOT_ENOUGH_REPLICAS. Other acks "
        "settings ignore it.",
    "unclean.leader.election.enable":
        "Whether a replica outside the in-sync set may become leader when no in-sync replica is "
        "alive. The partition becomes available again, but the records that replica lacks are "
        "lost.",
    "leader.replication.throttled.replicas":
        "Replicas whose replication traffic the leader limits to leader.replication.throttled.rate: "
        "a list of partition:broker pairs, or * for every replica of the topic; empty means none. "
        "Reassignment tools set it.",
    "follower.replication.throttled.replicas":
        "Replicas whose fetching from the leader is limited to follower.replication.throttled.rate: "
        "a list of partition:broker pairs, or * for every replica of the topic; empty means none. "
        "Reassignment tools set it.",
    "compression.type":
        "Codec of the record batches stored for this topic: producer keeps the one the producer "
        "used, while uncompressed, gzip, snappy, lz4 or zstd makes the broker recompress batches "
        "sent in another codec.",
    "compression.gzip.level":
        "Level (1 to 9) the broker compresses at when compression.type is gzip and it recompresses "
        "a batch; -1 uses the codec's default.",
    "compression.lz4.level":
        "Level (1 to 17) the broker compresses at when compression.type is lz4 and it recompresses "
        "a batch.",
    "compression.zstd.level":
        "Level the broker compresses at when compression.type is zstd and it recompresses a batch: "
        "up to 22, with negative levels trading ratio for speed.",
    "preallocate":
        "Accepted for compatibility; Strom does not preallocate segment files, which grow as "
        "records are written.",
    # Kafka 3.x keys that 4.0 removed: accepted with a warning and dropped.
    "message.format.version":
        "Accepted for compatibility and ignored (Kafka 4.0 removed it): Strom always stores record "
        "batches in the v2 format.",
    "message.downconversion.enable":
        "Accepted for compatibility and ignored: Strom never converts batches to the older formats, "
        "so clients older than Fetch v4 are not served.",
    "message.timestamp.difference.max.ms":
        "Accepted for compatibility and ignored; message.timestamp.before.max.ms and "
        "message.timestamp.after.max.ms bound record timestamps instead.",
}


def _default_of(topic_config: str, extra: str = "") -> str:
    return f"Broker default of the topic config {topic_config}, for topics that do not set it. {extra}".rstrip()


# Broker configs (strom.config.broker.DEFINITIONS), as DescribeConfigs reports them for a
# BROKER resource.
BROKER_DOCS: dict[str, str] = {
    # Identity, listeners and storage.
    "broker.id":
        "This broker's id, unique in the cluster; node.id replaces it when set.",
    "node.id":
        "KRaft's name for the broker id: when set it is used instead of broker.id. Unset by "
        "default.",
    "broker.rack":
        "Rack or availability zone of this broker. Replicas of new partitions are spread over "
        "racks, and clients see the rack in metadata. With replica.selector.class set, consumers "
        "that give client.rack may read from a follower in their rack.",
    "replica.selector.class":
        "Picks the replica a consumer fetches from (KIP-392); unset, consumers read from "
        "leaders. org.apache.kafka.common.replica.RackAwareReplicaSelector sends a consumer whose "
        "client.rack is a follower's broker.rack, and not the leader's, to the most caught-up "
        "in-sync follower there; a Python class with a select method may be named instead.",
    "listeners":
        "Comma-separated NAME://host:port addresses the broker accepts connections on. The name "
        "picks the security protocol through listener.security.protocol.map, or is one itself "
        "(PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL).",
    "advertised.listeners":
        "Addresses, written like listeners, that metadata tells clients and other brokers to "
        "connect to when they differ from listeners; each must name an existing listener. Unset "
        "means the listeners themselves are advertised.",
    "inter.broker.listener.name":
        "Listener other brokers connect to this one through. Unset means the listener named by "
        "security.inter.broker.protocol, or the first listener.",
    "control.plane.listener.name":
        "Listener the controller reaches brokers through; when set, Strom's brokers also use it "
        "for the rest of their traffic to each other.",
    "security.inter.broker.protocol":
        "Security protocol of traffic between brokers when inter.broker.listener.name is not set: "
        "the listener of that name carries it.",
    "listener.security.protocol.map":
        "Comma-separated LISTENER:PROTOCOL pairs giving listener names their security protocol. A "
        "listener not in the map uses its name if that is a protocol, PLAINTEXT otherwise.",
    "log.dirs":
        "Comma-separated directories for partition logs, new partitions being spread over them. "
        "Unset means log.dir.",
    "cordoned.log.dirs":
        "Comma-separated log directories of this broker (of log.dirs), or * for all of them, that "
        "take no new partition (KIP-1066): new partitions go to the other directories, and a broker whose directories are "
        "all cordoned gets no new replicas from a KRaft controller. The partitions already there "
        "stay and keep serving. Per-broker dynamic.",
    "log.dir":
        "Directory for partition logs when log.dirs is not set.",
    "log.dir.min.free.bytes":
        "Strom's own: free space in bytes below which a log directory refuses writes with "
        "KAFKA_STORAGE_ERROR while still serving reads, until retention or deletions free enough; "
        "0 turns the check off.",
    "max.broker.partitions":
        "Most partition replicas this broker may hold: CreateTopics and CreatePartitions that "
        "would go beyond it fail with POLICY_VIOLATION. Each partition costs about 8.3 MB of RSS per "
        "1,000 (benchmarks/partitions.py); 100,000 run, with the restart and stall costs its "
        "README states.",
    "metrics.port":
        "Strom's own: the port of the Prometheus endpoint (GET /metrics). -1, the default, turns it "
        "off; 0 picks a free port.",
    "metrics.host":
        "Strom's own: the address the Prometheus endpoint listens on when metrics.port is set.",
    "schema.registry.listeners":
        "Where the schema registry's REST API listens (http://host:port or https://host:port, the "
        "latter with the broker's ssl.* keystore); unset, the default, turns the registry off.",
    "schema.registry.kafkastore.topic":
        "The compacted topic of one partition that holds the schema registry's schemas, configs and "
        "modes in Confluent's record format.",
    "schema.registry.kafkastore.topic.replication.factor":
        "Replication factor of the schema registry's topic when it is made (at most the live brokers "
        "then).",
    "schema.registry.schema.compatibility.level":
        "The schema registry's compatibility level while no global config is set: none, backward, "
        "forward, full or their _transitive forms.",
    "schema.registry.mode.mutability":
        "Whether the schema registry's mode (READWRITE, READONLY, IMPORT) may be changed through "
        "PUT /mode.",
    "schema.registry.authentication.method":
        "NONE, or BASIC: HTTP basic authentication against the broker's SASL users (PLAIN users of the "
        "JAAS config, SCRAM users), with the broker's authorizer deciding when one is configured.",
    "schema.registry.request.max.bytes":
        "Strom's own: the largest request body the schema registry reads; a larger one gets 413.",
    "schema.registry.max.connections":
        "Strom's own: the most connections the schema registry keeps open; more are closed as they "
        "arrive.",
    # Iceberg topics (docs/iceberg-topics.md).
    "iceberg.enabled":
        "Strom's own: whether this broker translates topics with an iceberg.mode into Iceberg tables; "
        "a topic may set iceberg.mode only where it is true.",
    "iceberg.catalog.type":
        "Strom's own: the Iceberg catalog, sql (a SQL database, SQLite by default, for one broker or a "
        "shared database) or rest (an Iceberg REST catalog). Other iceberg.catalog.<key> settings are "
        "handed to the catalog as its properties.",
    "iceberg.catalog.uri":
        "Strom's own: the sql catalog's SQLAlchemy URL (default sqlite under the first log dir, "
        "iceberg/catalog.db) or the rest catalog's endpoint.",
    "iceberg.catalog.name": "Strom's own: the name of the Iceberg catalog the tables are in.",
    "iceberg.namespace": "Strom's own: the Iceberg namespace of the topics' tables, each named after its topic.",
    "iceberg.warehouse":
        "Strom's own: where table files go, a file:// path (default iceberg/warehouse under the first "
        "log dir) or an s3:// bucket reached with the rsm.config.storage.s3.* and storage.aws.* keys.",
    "iceberg.commit.interval.ms":
        "Strom's own: how often, in milliseconds, a partition leader commits the records it has "
        "translated to the topic's Iceberg table (sooner when a batch grows large).",
    # Topic creation.
    "num.partitions":
        "Partition count of topics created without one, auto-created topics included.",
    "default.replication.factor":
        "Replication factor of topics created without one, auto-created topics included.",
    "auto.create.topics.enable":
        "Whether a Metadata request naming a missing topic (from a client that allows it) creates "
        "it with num.partitions and default.replication.factor.",
    "delete.topic.enable":
        "Whether DeleteTopics may delete topics; when false it is refused.",
    # Topic defaults.
    "log.segment.bytes": _default_of("segment.bytes", "Bytes at which the active segment is rolled."),
    "log.roll.ms": _default_of(
        "segment.ms", "Milliseconds after which the active segment is rolled; unset means log.roll.hours."),
    "log.roll.hours": _default_of(
        "segment.ms", "In hours, used when log.roll.ms is not set (168, a week, by default)."),
    "log.roll.jitter.ms": _default_of(
        "segment.jitter.ms", "In milliseconds; unset means log.roll.jitter.hours."),
    "log.roll.jitter.hours": _default_of(
        "segment.jitter.ms", "In hours, used when log.roll.jitter.ms is not set."),
    "log.retention.ms": _default_of(
        "retention.ms", "In milliseconds, -1 keeping records forever; it takes precedence over "
        "log.retention.minutes and log.retention.hours."),
    "log.retention.minutes": _default_of(
        "retention.ms", "In minutes, used when log.retention.ms is not set; it takes precedence "
        "over log.retention.hours."),
    "log.retention.hours": _default_of(
        "retention.ms", "In hours (168, a week, by default), used when neither log.retention.ms "
        "nor log.retention.minutes is set."),
    "log.retention.bytes": _default_of(
        "retention.bytes", "Bytes a partition's log may hold before its oldest segments go; -1 "
        "means no limit."),
    "log.index.interval.bytes": _default_of(
        "index.interval.bytes", "Bytes appended between two index entries."),
    "log.index.size.max.bytes": _default_of(
        "segment.index.bytes", "Largest size in bytes of a segment's index before the segment is "
        "rolled."),
    "log.segment.delete.delay.ms": _default_of(
        "file.delete.delay.ms", "Milliseconds a removed segment's files wait before they are "
        "deleted."),
    "log.cleanup.policy": _default_of("cleanup.policy", "delete, compact, or both."),
    "log.message.timestamp.type": _default_of("message.timestamp.type", "CreateTime or LogAppendTime."),
    "log.message.timestamp.before.max.ms": _default_of(
        "message.timestamp.before.max.ms", "How far, in milliseconds, a CreateTime timestamp may "
        "lie in the past."),
    "log.message.timestamp.after.max.ms": _default_of(
        "message.timestamp.after.max.ms", "How far, in milliseconds, a CreateTime timestamp may "
        "lie in the future."),
    "log.preallocate": _default_of(
        "preallocate", "Accepted for compatibility; Strom never preallocates segment files."),
    "log.local.retention.ms": _default_of(
        "local.retention.ms", "How long tiered topics keep copied segments on local disk; -2 means "
        "the same as the retention time."),
    "log.local.retention.bytes": _default_of(
        "local.retention.bytes", "How many bytes of a tiered partition stay on local disk; -2 means "
        "the same as the retention size."),
    # Tiered storage (KIP-405).
    "remote.log.storage.system.enable":
        "Whether this broker has tiered storage: topics may then set remote.storage.enable, and the "
        "broker copies their closed segments to the store the rsm.config.* keys name.",
    "remote.log.storage.manager.class.name":
        "Accepted for compatibility (a Java class name): the store is the one the "
        "rsm.config.storage.* keys describe (S3 or a directory).",
    "remote.log.storage.manager.class.path": "Accepted for compatibility; nothing is loaded from it.",
    "remote.log.storage.manager.impl.prefix":
        "The prefix of the remote store's own keys (rsm.config.storage.s3.bucket.name and the rest).",
    "remote.log.metadata.manager.class.name":
        "Accepted for compatibility: remote segment metadata always lives in the "
        "__remote_log_metadata topic, in Kafka's record format.",
    "remote.log.metadata.manager.class.path": "Accepted for compatibility; nothing is loaded from it.",
    "remote.log.metadata.manager.impl.prefix":
        "The prefix of the metadata topic's settings (rlmm.config.remote.log.metadata.topic."
        "num.partitions, .replication.factor, .retention.ms).",
    "remote.log.metadata.manager.listener.name":
        "Accepted for compatibility; the metadata topic is reached on the inter-broker listener.",
    "remote.log.metadata.custom.metadata.max.bytes":
        "Largest custom metadata a store may attach to a segment (Strom's stores attach none).",
    "remote.log.manager.task.interval.ms":
        "Milliseconds between two rounds of the remote log manager: copying closed segments, "
        "expiring remote ones, cleaning unfinished copies.",
    "remote.log.manager.task.retry.backoff.ms":
        "First wait, in milliseconds, before a failed remote deletion is tried again.",
    "remote.log.manager.task.retry.backoff.max.ms":
        "Longest wait, in milliseconds, between retries of a failed remote deletion.",
    "remote.log.manager.task.retry.jitter": "Accepted for compatibility (retries are not jittered).",
    "remote.log.manager.thread.pool.size": "Accepted for compatibility (followers need no task of their own).",
    "remote.log.manager.copier.thread.pool.size":
        "Threads that copy segments to the remote store; also the most copies under way at once.",
    "remote.log.manager.expiration.thread.pool.size": "Threads that delete remote segments.",
    "remote.log.manager.copy.max.bytes.per.second":
        "Bytes per second the broker copies to the remote store at most (a token bucket).",
    "remote.log.manager.copy.quota.window.num":
        "Accepted for compatibility (the copy quota is a token bucket of one second).",
    "remote.log.manager.copy.quota.window.size.seconds":
        "Accepted for compatibility (the copy quota is a token bucket of one second).",
    "remote.log.manager.fetch.max.bytes.per.second":
        "Bytes per second the broker reads from the remote store for fetches at most; over it, "
        "remote fetches are answered empty until the budget refills.",
    "remote.log.manager.fetch.quota.window.num":
        "Accepted for compatibility (the fetch quota is a token bucket of one second).",
    "remote.log.manager.fetch.quota.window.size.seconds":
        "Accepted for compatibility (the fetch quota is a token bucket of one second).",
    "remote.log.reader.threads": "Threads that read remote segments for fetches.",
    "remote.log.reader.max.pending.tasks":
        "Remote reads that may wait for a reader thread; beyond them a fetch gets no remote data "
        "this time and asks again.",
    "remote.log.index.file.cache.total.size.bytes":
        "Bytes of remote segment indexes (offset, time, transaction) kept in memory.",
    "remote.fetch.max.wait.ms":
        "Longest a fetch waits for its remote read before it is answered without it.",
    "remote.list.offsets.request.timeout.ms":
        "Longest a timestamp lookup in remote segments may take (ListOffsets answers "
        "REQUEST_TIMED_OUT after it).",
    "log.flush.interval.messages": _default_of(
        "flush.messages", f"Records appended before a log is fsynced; {_LONG_MAX} never forces "
        "a flush."),
    "log.flush.interval.ms": _default_of(
        "flush.ms", "Milliseconds between forced fsyncs of a log; unset means "
        "log.flush.scheduler.interval.ms."),
    "log.cleaner.min.cleanable.ratio": _default_of(
        "min.cleanable.dirty.ratio", "Dirty fraction (0 to 1) of a log at which it is compacted."),
    "log.cleaner.delete.retention.ms": _default_of(
        "delete.retention.ms", "Milliseconds tombstones stay readable after compaction reaches "
        "them."),
    "log.cleaner.min.compaction.lag.ms": _default_of(
        "min.compaction.lag.ms", "Milliseconds a record stays safe from compaction."),
    "log.cleaner.max.compaction.lag.ms": _default_of(
        "max.compaction.lag.ms", "Milliseconds after which a dirty record is compacted whatever "
        "the dirty ratio."),
    "message.max.bytes": _default_of(
        "max.message.bytes", "The largest record batch, in bytes, a produce may carry."),
    "min.insync.replicas": _default_of(
        "min.insync.replicas", "In-sync replicas an acks=all produce needs for a write to "
        "succeed."),
    "unclean.leader.election.enable": _default_of(
        "unclean.leader.election.enable", "Whether an out-of-sync replica may lead when no "
        "in-sync one is alive, losing the records it lacks."),
    "compression.type": _default_of(
        "compression.type", "producer keeps the producer's codec; uncompressed, gzip, snappy, lz4 "
        "or zstd makes the broker recompress into that one."),
    "compression.gzip.level": _default_of(
        "compression.gzip.level", "Level 1 to 9 for recompressing into gzip, -1 being the "
        "codec's default."),
    "compression.lz4.level": _default_of(
        "compression.lz4.level", "Level 1 to 17 for recompressing into lz4."),
    "compression.zstd.level": _default_of(
        "compression.zstd.level", "Level, up to 22, for recompressing into zstd."),
    "index.interval.bytes":
        "The topic config's own name, accepted in the broker's configuration as the default of "
        "index.interval.bytes; when set it takes precedence over log.index.interval.bytes.",
    # Background log work.
    "log.retention.check.interval.ms":
        "How often, in milliseconds, the broker looks for segments that retention by time, size "
        "or log start offset allows it to delete.",
    "log.flush.scheduler.interval.ms":
        "How often, in milliseconds, the broker checks whether any log is due for a flush under "
        "flush.ms, and the default of flush.ms when log.flush.interval.ms is not set. With its "
        f"default, {_LONG_MAX}, Strom still checks at a fixed interval for topics that set "
        "flush.ms.",
    "log.flush.offset.checkpoint.interval.ms":
        "How often, in milliseconds, every log's recovery point and log start offset are written "
        "to their directory's checkpoint files; it bounds how much log must be recovered after a "
        "crash.",
    "log.flush.start.offset.checkpoint.interval.ms":
        "Accepted for compatibility; Strom writes the log start offsets together with the recovery "
        "points, every log.flush.offset.checkpoint.interval.ms.",
    "replica.high.watermark.checkpoint.interval.ms":
        "How often, in milliseconds, the high watermarks of this broker's partitions are saved to "
        "disk.",
    "num.recovery.threads.per.data.dir":
        "Accepted for compatibility; Strom does not run a thread pool per log directory to load "
        "and close logs.",
    # Log cleaner.
    "log.cleaner.enable":
        "Whether the log cleaner runs; without it topics with cleanup.policy=compact are never "
        "compacted.",
    "log.cleaner.threads":
        "Number of logs the cleaner compacts at the same time.",
    "log.cleaner.backoff.ms":
        "How long, in milliseconds, the cleaner waits before looking again when no log needs "
        "compacting.",
    "log.cleaner.dedupe.buffer.size":
        "Memory in bytes, shared by all cleaner threads, for the map of keys to their latest "
        "offsets that compaction builds; a bigger map lets one pass cover more of a log.",
    "log.cleaner.io.buffer.load.factor":
        "How full (0 to 1) the cleaner lets its key map get: higher fits more keys into "
        "log.cleaner.dedupe.buffer.size at the cost of more hash collisions.",
    # Network and requests.
    "socket.request.max.bytes":
        "Largest request, in bytes, the broker reads; a connection sending a bigger one is closed.",
    "socket.send.buffer.bytes":
        "Send buffer (SO_SNDBUF), in bytes, of the broker's sockets; -1 keeps the operating "
        "system's default.",
    "socket.receive.buffer.bytes":
        "Receive buffer (SO_RCVBUF), in bytes, of the broker's sockets; -1 keeps the operating "
        "system's default.",
    "queued.max.request.bytes":
        "Bytes the requests read from all connections may hold together; a connection whose next "
        "request does not fit waits until memory is released. -1 means no bound, otherwise it "
        "must be at least socket.request.max.bytes; Strom sets 256 MiB by default.",
    "queued.max.requests":
        "Accepted for compatibility; Strom has no queue between network and request threads, and "
        "bounds the memory of waiting requests with queued.max.request.bytes.",
    "num.network.threads":
        "Accepted for compatibility; Strom serves connections on an asyncio event loop rather "
        "than a pool of network threads.",
    "num.io.threads":
        "Accepted for compatibility; Strom handles requests on its event loop rather than a pool "
        "of request handler threads.",
    "max.incremental.fetch.session.cache.slots":
        "Most incremental fetch sessions (KIP-227) the broker keeps at once; 0 turns them off, "
        "making every fetch a full one.",
    "max.request.partition.size.limit":
        "Most partitions a DescribeTopicPartitions response holds; clients page through the rest "
        "with its cursor.",
    # Connection limits and quotas.
    "max.connections":
        "Most connections the broker keeps open at once, over all listeners; connections beyond it "
        "are closed as they arrive.",
    "max.connections.per.ip":
        "Most connections open at once from one IP address; connections beyond it are closed as "
        "they arrive.",
    "max.connections.per.ip.overrides":
        "Per-address exceptions to max.connections.per.ip, as comma-separated host:count pairs.",
    "max.connection.creation.rate":
        "Most new connections per second the broker accepts over all listeners; connections "
        "beyond that rate are closed as they arrive.",
    "connections.max.idle.ms":
        "Milliseconds a connection may stay idle before the broker closes it; -1 never closes "
        "idle connections.",
    "quota.window.num":
        "Number of windows client quota rates are measured over.",
    "quota.window.size.seconds":
        "Length in seconds of each window client quota rates are measured over.",
    # Replication.
    "replica.lag.time.max.ms":
        "A follower that has not caught up with the leader's log end within this many "
        "milliseconds is dropped from the in-sync replica set.",
    "num.replica.fetchers":
        "Connections this broker spreads its fetching from one leader broker over; more can "
        "speed up replication.",
    "replica.fetch.max.bytes":
        "Bytes a follower asks for per partition in each replication fetch; a first batch bigger "
        "than that still comes whole.",
    "replica.fetch.response.max.bytes":
        "Bytes a whole replication fetch response may hold, over all its partitions.",
    "replica.fetch.wait.max.ms":
        "Longest time, in milliseconds, a replication fetch waits at the leader for "
        "replica.fetch.min.bytes of data; it should stay below replica.lag.time.max.ms.",
    "replica.fetch.min.bytes":
        "Bytes a replication fetch waits for before the leader answers, up to "
        "replica.fetch.wait.max.ms.",
    "replica.fetch.backoff.ms":
        "Milliseconds a fetcher waits after a failed replication fetch before trying again.",
    "leader.replication.throttled.rate":
        "Bytes per second this broker sends, as leader, for the replicas named in "
        "leader.replication.throttled.replicas; the default leaves it unlimited.",
    "follower.replication.throttled.rate":
        "Bytes per second this broker fetches, as follower, for the replicas named in "
        "follower.replication.throttled.replicas; the default leaves it unlimited.",
    # Controller and shutdown.
    "controlled.shutdown.enable":
        "Whether a stopping broker first asks the controller to move its partitions' leadership "
        "to other replicas; only a broker in a ZooKeeper cluster does.",
    "controlled.shutdown.max.retries":
        "How many times a controlled shutdown is retried when the controller does not complete it.",
    "controlled.shutdown.retry.backoff.ms":
        "Milliseconds between controlled shutdown attempts.",
    "auto.leader.rebalance.enable":
        "Whether the controller moves leadership back to each partition's preferred replica once "
        "a broker's share of other leaders exceeds leader.imbalance.per.broker.percentage.",
    "leader.imbalance.check.interval.seconds":
        "How often, in seconds, the controller checks leadership balance.",
    "leader.imbalance.per.broker.percentage":
        "Percentage of a broker's preferred partitions led by another broker above which the "
        "controller rebalances leadership.",
    # Consumer offsets and groups.
    "offsets.topic.num.partitions":
        "Partitions of __consumer_offsets when it is created; later changes have no effect.",
    "offsets.topic.replication.factor":
        "Replication factor of __consumer_offsets. A cluster with fewer live brokers cannot "
        "create it, so groups wait; a standalone broker uses its one replica.",
    "offsets.topic.segment.bytes":
        "segment.bytes of __consumer_offsets, set when it is created.",
    "offsets.retention.minutes":
        "Minutes a group's committed offsets are kept once it has no members (for a consumer "
        "without a group protocol, after the commit) before they are deleted.",
    "offsets.retention.check.interval.ms":
        "How often, in milliseconds, the coordinator looks for expired offsets.",
    "offsets.commit.timeout.ms":
        "Milliseconds an offset commit waits for its write to __consumer_offsets to be replicated "
        "before it fails.",
    "offsets.load.buffer.size":
        "Accepted for compatibility; Strom loads __consumer_offsets without a read buffer of this "
        "size.",
    "offset.metadata.max.bytes":
        "Largest metadata string, in bytes, a committed offset may carry; bigger ones fail with "
        "OFFSET_METADATA_TOO_LARGE.",
    "group.initial.rebalance.delay.ms":
        "Milliseconds a new classic group waits for more members before its first rebalance; 0 "
        "rebalances at once.",
    "group.min.session.timeout.ms":
        "Shortest session timeout, in milliseconds, a classic group member may ask for.",
    "group.max.session.timeout.ms":
        "Longest session timeout, in milliseconds, a classic group member may ask for.",
    "group.max.size":
        "Most members a classic group may have; more joins are refused.",
    "group.coordinator.rebalance.protocols":
        "Group protocols the coordinator serves: classic (JoinGroup and SyncGroup) and consumer "
        "(KIP-848's ConsumerGroupHeartbeat).",
    "group.consumer.session.timeout.ms":
        "Milliseconds a member of a KIP-848 consumer group may go without a heartbeat before it "
        "is removed.",
    "group.consumer.min.session.timeout.ms":
        "Lower bound, in milliseconds, for group.consumer.session.timeout.ms.",
    "group.consumer.max.session.timeout.ms":
        "Upper bound, in milliseconds, for group.consumer.session.timeout.ms.",
    "group.consumer.heartbeat.interval.ms":
        "Milliseconds between heartbeats the coordinator asks of KIP-848 consumer group members.",
    "group.consumer.min.heartbeat.interval.ms":
        "Lower bound, in milliseconds, for group.consumer.heartbeat.interval.ms.",
    "group.consumer.max.heartbeat.interval.ms":
        "Upper bound, in milliseconds, for group.consumer.heartbeat.interval.ms.",
    "group.consumer.max.size":
        "Most members a KIP-848 consumer group may have.",
    "group.consumer.assignors":
        "Server-side partition assignors of KIP-848 consumer groups (uniform, range); the first "
        "is used when a member names none.",
    "group.consumer.assignment.interval.ms":
        "Milliseconds between assignment updates of a consumer group (KIP-1240): the default of a "
        "group's consumer.assignment.interval.ms. Strom assigns at each change of a group's epoch.",
    "group.consumer.min.assignment.interval.ms":
        "Lower bound, in milliseconds, for a group's consumer.assignment.interval.ms.",
    "group.consumer.max.assignment.interval.ms":
        "Upper bound, in milliseconds, for a group's consumer.assignment.interval.ms.",
    # KIP-932 share groups.
    "group.share.session.timeout.ms":
        "Milliseconds a share group member may go without a heartbeat before it is removed and "
        "the records it holds go back to the group.",
    "group.share.min.session.timeout.ms": "Lower bound, in milliseconds, for group.share.session.timeout.ms.",
    "group.share.max.session.timeout.ms": "Upper bound, in milliseconds, for group.share.session.timeout.ms.",
    "group.share.heartbeat.interval.ms":
        "Milliseconds between heartbeats the coordinator asks of share group members.",
    "group.share.min.heartbeat.interval.ms": "Lower bound, in milliseconds, for group.share.heartbeat.interval.ms.",
    "group.share.max.heartbeat.interval.ms": "Upper bound, in milliseconds, for group.share.heartbeat.interval.ms.",
    "group.share.max.size": "Most members a share group may have.",
    "group.share.delivery.count.limit":
        "Deliveries of a record to share group members after which it is archived (never delivered "
        "again) instead of made available once more. A group's share.delivery.count.limit overrides it.",
    "group.share.min.delivery.count.limit":
        "Lower bound for a group's share.delivery.count.limit (KIP-1240).",
    "group.share.max.delivery.count.limit":
        "Upper bound for a group's share.delivery.count.limit (KIP-1240).",
    "group.share.min.partition.max.record.locks":
        "Lower bound for a group's share.partition.max.record.locks (KIP-1240).",
    "group.share.max.partition.max.record.locks":
        "Upper bound for a group's share.partition.max.record.locks (KIP-1240).",
    "group.share.assignment.interval.ms":
        "Milliseconds between assignment updates of a share group (KIP-1240): the default of a "
        "group's share.assignment.interval.ms. Strom assigns at each change of a group's epoch.",
    "group.share.min.assignment.interval.ms":
        "Lower bound, in milliseconds, for a group's share.assignment.interval.ms.",
    "group.share.max.assignment.interval.ms":
        "Upper bound, in milliseconds, for a group's share.assignment.interval.ms.",
    "group.share.record.lock.duration.ms":
        "Milliseconds a record acquired by a share group member stays locked to it; then it becomes "
        "available to the group again. A group's share.record.lock.duration.ms overrides it.",
    "group.share.min.record.lock.duration.ms":
        "Lower bound, in milliseconds, for a group's share.record.lock.duration.ms.",
    "group.share.max.record.lock.duration.ms":
        "Upper bound, in milliseconds, for a group's share.record.lock.duration.ms.",
    "group.share.partition.max.record.locks":
        "Most records of one partition a share group may have in flight (acquired or waiting for "
        "redelivery); fetches acquire no new records beyond it. A group's "
        "share.partition.max.record.locks overrides it.",
    "group.share.max.share.sessions":
        "Most share sessions (one per share group member fetching from this broker) the broker keeps; "
        "past it ShareFetch opening a session answers SHARE_SESSION_LIMIT_REACHED.",
    "errors.deadletterqueue.topic.name.prefix":
        "The prefix a share group's dead-letter topic (errors.deadletterqueue.topic.name) must have "
        "(KIP-1191); blank: any name.",
    "errors.deadletterqueue.auto.create.topics.enable":
        "Whether a share group's dead-letter topic that does not exist is created (the broker's "
        "num.partitions and default.replication.factor, errors.deadletterqueue.group.enable=true).",
    "share.coordinator.state.topic.num.partitions":
        "Partitions of __share_group_state when it is created; later changes have no effect.",
    "share.coordinator.state.topic.replication.factor":
        "Replication factor of __share_group_state when it is created (capped at the live brokers "
        "of a single embedded broker).",
    "share.coordinator.state.topic.segment.bytes": "Segment size of __share_group_state.",
    "share.coordinator.state.topic.min.isr":
        "min.insync.replicas of __share_group_state when it is created (at most its replication "
        "factor): a share-state write is answered once that many replicas have it.",
    # Transactions and producer state.
    "transaction.state.log.num.partitions":
        "Partitions of __transaction_state when it is created; later changes have no effect.",
    "transaction.state.log.replication.factor":
        "Replication factor of __transaction_state. A cluster with fewer live brokers cannot "
        "create it, so transactions wait; a standalone broker uses its one replica.",
    "transaction.state.log.segment.bytes":
        "segment.bytes of __transaction_state, set when it is created.",
    "transaction.state.log.min.isr":
        "Accepted for compatibility; Strom creates __transaction_state without a "
        "min.insync.replicas of its own, so the broker's min.insync.replicas applies.",
    "transaction.max.timeout.ms":
        "Longest transaction timeout, in milliseconds, a producer may ask for; InitProducerId "
        "with a longer one fails with INVALID_TRANSACTION_TIMEOUT.",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms":
        "How often, in milliseconds, the transaction coordinator aborts transactions that have "
        "outlived their timeout.",
    "transactional.id.expiration.ms":
        "Milliseconds a transactional id may go without a transaction before the coordinator "
        "forgets it.",
    "transaction.remove.expired.transaction.cleanup.interval.ms":
        "How often, in milliseconds, the coordinator removes expired transactional ids.",
    "producer.id.expiration.ms":
        "Milliseconds after a producer's last write to a partition before the partition forgets "
        "its idempotence state (sequence numbers).",
    "producer.id.expiration.check.interval.ms":
        "How often, in milliseconds, expired producer state is removed.",
    # ZooKeeper.
    "zookeeper.connect":
        "ZooKeeper connection string (host:port[,host:port...][/chroot]) of the cluster's "
        "metadata. Unset, Strom runs as a standalone broker that keeps its metadata itself.",
    "zookeeper.session.timeout.ms":
        "ZooKeeper session timeout in milliseconds; a broker silent for this long loses its "
        "registration.",
    "zookeeper.connection.timeout.ms":
        "Milliseconds the broker waits to connect to ZooKeeper; unset means "
        "zookeeper.session.timeout.ms.",
    "zookeeper.set.acl":
        "Whether the znodes the broker creates get ACLs that let only the broker's ZooKeeper "
        "user change them (see zookeeper.digest.auth).",
    "zookeeper.digest.auth":
        "Strom's own: the user:password the broker authenticates to ZooKeeper with (digest "
        "scheme), which Kafka takes from the JAAS file's Client section.",
    # TLS.
    "ssl.keystore.type":
        "Format of the keystore: JKS (the default), PKCS12 or PEM; another type is refused when "
        "the SSL listener starts.",
    "ssl.keystore.location":
        "Path of the keystore (of ssl.keystore.type) with the broker's private key and "
        "certificate chain for SSL listeners.",
    "ssl.keystore.password":
        "Password of the keystore's private key, used when ssl.key.password is not set.",
    "ssl.key.password":
        "Password that decrypts the keystore's private key.",
    "ssl.keystore.certificate.chain":
        "The broker's certificate chain in PEM, given inline instead of ssl.keystore.location, "
        "with ssl.keystore.key.",
    "ssl.keystore.key":
        "The broker's private key in PEM, given inline with ssl.keystore.certificate.chain.",
    "ssl.truststore.type":
        "Format of the truststore: JKS (the default), PKCS12 or PEM; another type is refused "
        "when the SSL listener starts.",
    "ssl.truststore.location":
        "Path of the truststore (of ssl.truststore.type) of CA certificates that client "
        "certificates, and other brokers' certificates, are verified against.",
    "ssl.truststore.password":
        "Accepted for compatibility; PEM truststores have no password, so Strom does not use it.",
    "ssl.truststore.certificates":
        "CA certificates in PEM, given inline instead of ssl.truststore.location.",
    "ssl.client.auth":
        "Whether SSL listeners ask clients for a certificate: none, requested (optional) or "
        "required. A verified certificate's subject becomes the client's principal.",
    "ssl.enabled.protocols":
        "TLS versions SSL listeners accept, comma-separated (TLSv1.2, TLSv1.3).",
    "ssl.cipher.suites":
        "Comma-separated cipher suites TLS connections may use; empty allows the TLS library's "
        "defaults.",
    "ssl.protocol":
        "Accepted for compatibility; Strom takes the TLS versions from ssl.enabled.protocols.",
    "ssl.endpoint.identification.algorithm":
        "https makes the broker check that another broker's certificate matches its host name "
        "when connecting over TLS; empty skips the check.",
    # SASL.
    "sasl.enabled.mechanisms":
        "Comma-separated SASL mechanisms SASL listeners offer. Strom supports PLAIN, "
        "SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER, not the default GSSAPI.",
    "sasl.mechanism.inter.broker.protocol":
        "SASL mechanism brokers authenticate to each other with over a SASL inter-broker "
        "listener; Strom supports PLAIN and SCRAM-SHA-256/512 there.",
    "sasl.server.max.receive.size":
        "Largest frame, in bytes, a connection may send before SASL authentication completes; a "
        "bigger one closes it.",
    "connections.max.reauth.ms":
        "When positive, the longest in milliseconds a SASL session lasts before the client must "
        "authenticate again (KIP-368); 0 lets sessions last.",
    "connection.failed.authentication.delay.ms":
        "Milliseconds the broker waits before answering a failed authentication, slowing down "
        "password guessing; 0 answers at once.",
    "sasl.server.failed.authentication.limit":
        "Failed SASL authentications of one user from one address within the window, after "
        "which that user's next attempts from there wait their turn (never refused, so a correct "
        "password gets in); other users, addresses and the brokers' own user are not slowed. 0: off.",
    "sasl.server.failed.authentication.window.ms":
        "The window, in milliseconds, over which sasl.server.failed.authentication.limit counts "
        "failed authentications.",
    # Delegation tokens.
    "delegation.token.secret.key":
        "Secret that signs delegation tokens; setting it turns delegation tokens on, and every "
        "broker must have the same one.",
    "delegation.token.master.key":
        "Deprecated name of delegation.token.secret.key, used when that is not set.",
    "delegation.token.max.lifetime.ms":
        "Longest a delegation token may live, in milliseconds, however often it is renewed.",
    "delegation.token.expiry.time.ms":
        "Milliseconds a delegation token stays valid after it is created or last renewed, within "
        "delegation.token.max.lifetime.ms.",
    "delegation.token.expiry.check.interval.ms":
        "How often, in milliseconds, expired delegation tokens are removed.",
    # KRaft.
    "process.roles":
        "KRaft roles of this node: broker, controller, or broker,controller (combined). Unset, the "
        "node is a ZooKeeper-mode or embedded broker.",
    "controller.listener.names":
        "Listeners that carry controller traffic only (the Raft quorum and the controller's "
        "APIs); the first is the one this node's controller uses.",
    "controller.quorum.voters":
        "Static voters of the metadata quorum as id@host:port, comma-separated; empty when the "
        "quorum is dynamic (controller.quorum.bootstrap.servers).",
    "controller.quorum.bootstrap.servers":
        "host:port of controllers a node asks for the quorum's leader when it does not know the "
        "voters (dynamic quorums, KIP-853).",
    "controller.quorum.election.timeout.ms":
        "Milliseconds a voter waits without a leader before standing for election (randomized "
        "up to twice as long).",
    "controller.quorum.fetch.timeout.ms":
        "Milliseconds a follower waits without a successful fetch from the leader before it "
        "looks for a new one.",
    "controller.quorum.election.backoff.max.ms":
        "Longest random backoff, in milliseconds, before a voter that lost an election stands "
        "again.",
    "controller.quorum.append.linger.ms":
        "Milliseconds the quorum leader may wait to gather appends into one batch before it "
        "writes them.",
    "controller.quorum.request.timeout.ms":
        "Milliseconds a quorum request (vote, fetch, epoch change) waits for its answer.",
    "controller.quorum.retry.backoff.ms":
        "Milliseconds a node waits before retrying a failed quorum request.",
    "metadata.log.dir":
        "Directory of the __cluster_metadata partition; the first log dir when unset.",
    "metadata.log.segment.bytes":
        "Largest size in bytes of a segment of the metadata log before a new one starts.",
    "metadata.log.max.record.bytes.between.snapshots":
        "Bytes of new metadata records after which a controller writes a new snapshot of the "
        "metadata image.",
    "metadata.log.max.snapshot.interval.ms":
        "Longest time in milliseconds between snapshots of the metadata image while new records "
        "arrive; 0 turns the time bound off.",
    "broker.session.timeout.ms":
        "Milliseconds without a heartbeat after which the controller fences a broker: it loses "
        "its leaderships and leaves every ISR.",
    "broker.heartbeat.interval.ms":
        "Milliseconds between a broker's heartbeats to the active controller.",
    "initial.broker.registration.timeout.ms":
        "Milliseconds a KRaft broker keeps trying to register with a controller at start-up "
        "before it gives up and exits.",
    "sasl.mechanism.controller.protocol":
        "SASL mechanism a node uses on a SASL controller listener when it talks to controllers.",
    # Authorization.
    "authorizer.class.name":
        "Authorizer that checks ACLs; empty turns authorization off. Kafka's AclAuthorizer and "
        "StandardAuthorizer names both select Strom's own ACL authorizer.",
    "super.users":
        "Semicolon-separated principals (User:name) allowed everything whatever the ACLs say.",
    "allow.everyone.if.no.acl.found":
        "When true, a resource with no ACLs at all is open to every principal; when false only "
        "super users may use it.",
}


def doc(name: str, *, broker: bool = False) -> str | None:
    """The documentation of config `name`, None for a name without one. A name that is both a
    topic config and a broker config (min.insync.replicas) is described as the topic's config
    unless `broker`."""
    first, second = (BROKER_DOCS, TOPIC_DOCS) if broker else (TOPIC_DOCS, BROKER_DOCS)
    return first.get(name) or second.get(name)
