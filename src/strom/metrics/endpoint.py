"""The Prometheus endpoint: Kafka's well-known broker metrics, built when scraped.

A scrape arrives on prometheus-client's HTTP thread (`metrics.port`); the metrics are built on
the broker's event loop, so they see the broker's state as the loop does, from the counters
metrics.py records and from the broker's own state. Imported only when the endpoint is on,
so a broker without it does not load prometheus-client. docs/metrics.md maps each metric to
Kafka's MBean.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from strom.metrics.client_telemetry import PUSH_ERRORS
from strom.metrics.iceberg import iceberg_families
from strom.metrics.stats import (
    PHASES,
    TOPIC_COUNTERS,
    BrokerTopicStats,
    Histogram,
    RequestMetrics,
    api_name,
)

log = logging.getLogger(__name__)

_SCRAPE_TIMEOUT_S = 10.0


def histogram_family(name: str, doc: str, labels: list[str],
                     series: Iterable[tuple[list[str], Histogram]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, hist in series:
        family.add_metric(values, hist.buckets(), hist.total)
    return family


def request_families(metrics: RequestMetrics) -> Iterator[Any]:
    names = {key: api_name(key) for key in metrics.apis}
    requests = CounterMetricFamily("strom_requests", "Requests answered, per API and version",
                                   labels=["request", "version"])
    for key, stats in metrics.apis.items():
        for version, count in sorted(stats.versions.items()):
            requests.add_metric([names[key], str(version)], count)
    yield requests
    for i, (name, doc) in enumerate(PHASES):
        yield histogram_family(name, doc, ["request"],
                               (([names[key]], stats.phases[i]) for key, stats in metrics.apis.items()))


def topic_families(stats: BrokerTopicStats) -> Iterator[Any]:
    for i, (name, doc) in enumerate(TOPIC_COUNTERS):
        per_topic = CounterMetricFamily(f"strom_topic_{name}", f"{doc}, per topic", labels=["topic"])
        for topic, counts in stats.topics.items():
            per_topic.add_metric([topic], counts[i])
        yield per_topic
        yield CounterMetricFamily(f"strom_{name}", f"{doc}, all topics",
                                  value=stats.total(i))
    yield CounterMetricFamily("strom_replication_bytes_in", "Bytes this broker copied from leaders as a follower",
                              value=stats.replication_bytes_in)
    yield CounterMetricFamily("strom_replication_bytes_out", "Bytes followers fetched from this broker",
                              value=stats.replication_bytes_out)


# --- what a scrape reads from the broker --------------------------------------------------

def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def broker_families(broker: Any) -> Iterator[Any]:
    """The metrics that are the broker's state, read on the loop at scrape time."""
    rm, socket_server = broker.replica_manager, broker.socket_server
    partitions = list(rm.partitions.values())
    leaders = [p for p in partitions if p.is_leader]
    yield _gauge("strom_partitions", "Partitions this broker holds a replica of (PartitionCount)", len(partitions))
    yield _gauge("strom_leader_partitions", "Partitions this broker leads (LeaderCount)", len(leaders))
    yield _gauge("strom_under_replicated_partitions", "Led partitions with fewer in-sync replicas than replicas",
                 sum(len(p.isr) < len(p.replicas) for p in leaders))
    yield _gauge("strom_under_min_isr_partitions", "Led partitions with fewer in-sync replicas than min.insync.replicas",
                 sum(len(p.isr) < p.log.config.min_insync_replicas for p in leaders))
    yield _gauge("strom_at_min_isr_partitions", "Led partitions with exactly min.insync.replicas in sync",
                 sum(len(p.isr) == p.log.config.min_insync_replicas for p in leaders))
    yield _gauge("strom_follower_stalled_partitions",
                 "Followed partitions not fetched from their leader for over replica.lag.time.max.ms",
                 broker.replica_fetchers.stalled_partitions())
    yield _gauge("strom_offline_log_dirs", "Log dirs taken offline by an I/O error",
                 len(broker.log_manager.offline_dirs))
    yield CounterMetricFamily("strom_isr_shrinks", "ISR shrinks the controller accepted", value=rm.isr_shrinks)
    yield CounterMetricFamily("strom_isr_expands", "ISR expansions the controller accepted", value=rm.isr_expands)
    purgatory = GaugeMetricFamily("strom_purgatory_size", "Requests waiting in a purgatory",
                                  labels=["operation"])
    purgatory.add_metric(["Produce"], len(rm.produce_purgatory))
    purgatory.add_metric(["Fetch"], len(rm.fetch_purgatory))
    yield purgatory
    sessions = broker.fetch_sessions
    yield _gauge("strom_incremental_fetch_sessions", "Incremental fetch sessions cached (KIP-227)", len(sessions))
    yield _gauge("strom_incremental_fetch_partitions_cached", "Partitions held by the cached fetch sessions",
                 sessions.partitions_cached)
    yield CounterMetricFamily("strom_incremental_fetch_session_evictions",
                              "Fetch sessions evicted to make room for new ones", value=sessions.evictions)
    # A KRaft node has no controller object on its broker: its view of the quorum's stands in.
    yield from _controller_families(broker.controller or getattr(broker, "quorum_controller_view", None))
    yield from _log_families(broker)
    yield from remote_families(getattr(broker, "remote_log_manager", None), rm.partitions)
    yield from iceberg_families(getattr(broker, "iceberg_topics", None))
    yield from _share_dead_letter_families(getattr(broker, "share_partitions", None))
    yield from _group_families(broker)
    yield from _network_families(socket_server)
    yield from client_telemetry_families(getattr(broker, "client_telemetry", None))


def raft_families(driver: Any) -> Iterator[Any]:
    """Kafka's raft-metrics of a controller node's quorum: its state, leader, epoch, offsets."""
    core = getattr(driver, "core", None)
    if core is None:
        return
    yield _gauge("strom_raft_current_leader", "The quorum's leader as this node knows it (-1: none)", core.leader_id)
    yield _gauge("strom_raft_current_epoch", "The quorum's epoch as this node knows it", core.epoch)
    yield _gauge("strom_raft_high_watermark", "The metadata log's high watermark on this node", core.high_watermark)
    yield _gauge("strom_raft_log_end_offset", "The end of this node's metadata log", core.log.end_offset)
    yield _gauge("strom_raft_voters", "Voters of the quorum", len(core.voters.ids))
    state = GaugeMetricFamily("strom_raft_current_state", "1 for this node's state in the quorum", labels=["state"])
    state.add_metric([core.role.value], 1)
    yield state


def controller_node_families(server: Any) -> Iterator[Any]:
    """What a dedicated controller (process.roles=controller) serves: the quorum controller's view
    of the cluster (from its own image, on its own loop) and the quorum's raft metrics."""
    controller = server.controller
    yield from _controller_families(_ImageController(controller) if controller is not None else None)
    yield from raft_families(server.driver)


class _ImageController:
    """A quorum controller as _controller_families reads one: active, and the cluster its image holds."""

    def __init__(self, controller: Any) -> None:
        self.is_active = controller.active
        self.ctx = self
        self.topics = controller.image.topics
        self.live_brokers = {b.id for b in controller.image.brokers.values() if not b.fenced}


def _controller_families(controller: Any) -> Iterator[Any]:
    active = controller is not None and controller.is_active
    topics = controller.ctx.topics.values() if active else ()
    states = [s for t in topics for s in t.partitions.values()]
    live = controller.ctx.live_brokers if active else {}
    yield _gauge("strom_active_controller", "1 on the broker that is the active controller", int(active))
    yield _gauge("strom_offline_partitions", "Partitions without a live leader (on the active controller)",
                 sum(s.leader < 0 or s.leader not in live for s in states))
    yield _gauge("strom_global_topics", "Topics in the cluster (on the active controller)", len(topics))
    yield _gauge("strom_global_partitions", "Partitions in the cluster (on the active controller)", len(states))


def _log_families(broker: Any) -> Iterator[Any]:
    labels = ["topic", "partition"]
    size = GaugeMetricFamily("strom_log_size_bytes", "Bytes in a partition's log", labels=labels)
    segments = GaugeMetricFamily("strom_log_segments", "Segments in a partition's log", labels=labels)
    start = GaugeMetricFamily("strom_log_start_offset", "A partition's log start offset", labels=labels)
    end = GaugeMetricFamily("strom_log_end_offset", "A partition's log end offset", labels=labels)
    for (topic, index), lg in broker.log_manager.logs():
        key = [topic, str(index)]
        size.add_metric(key, lg.size_in_bytes)
        segments.add_metric(key, len(lg.segments))
        start.add_metric(key, lg.log_start_offset)
        end.add_metric(key, lg.log_end_offset)
    yield from (size, segments, start, end)
    yield histogram_family("strom_log_flush_seconds", "fsyncs of logs (LogFlushRateAndTimeMs)", [],
                           [([], broker.log_services.flush_time)])
    cleaner = broker.log_services.cleaner
    last = cleaner.last_result
    yield CounterMetricFamily("strom_log_cleaner_passes", "Compaction passes completed", value=cleaner.passes)
    yield CounterMetricFamily("strom_log_cleaner_read_bytes", "Bytes compaction read", value=cleaner.bytes_read)
    yield CounterMetricFamily("strom_log_cleaner_written_bytes", "Bytes compaction wrote", value=cleaner.bytes_written)
    yield _gauge("strom_log_cleaner_max_dirty_ratio",
                 "Highest dirty ratio of a compacted log at the cleaner's last look (max-dirty-percent / 100)",
                 cleaner.max_dirty_ratio)
    yield _gauge("strom_log_cleaner_last_pass_seconds", "Duration of the last compaction pass",
                 last.elapsed_s if last is not None else 0)
    yield _gauge("strom_log_cleaner_seconds_since_last_run", "Seconds since a compaction pass last ended",
                 time.monotonic() - cleaner.last_run if cleaner.last_run else 0)
    yield _gauge("strom_log_cleaner_uncleanable_partitions", "Logs the cleaner gave up on after an error",
                 len(cleaner.uncleanable))


# Kafka's remote storage rates (BrokerTopicStats' Remote*PerSec), as counters: the attribute of
# the RemoteLogManager's stats, the metric, its doc.
REMOTE_COUNTERS = (
    ("copy_bytes", "strom_remote_copy_bytes", "Bytes of segments copied to remote storage (RemoteCopyBytesPerSec)"),
    ("copy_requests", "strom_remote_copy_requests", "Segments copied to remote storage (RemoteCopyRequestsPerSec)"),
    ("copy_errors", "strom_remote_copy_errors", "Segment copies that failed (RemoteCopyErrorsPerSec)"),
    ("fetch_bytes", "strom_remote_fetch_bytes", "Bytes read from remote storage for fetches (RemoteFetchBytesPerSec)"),
    ("fetch_requests", "strom_remote_fetch_requests", "Fetch reads from remote storage (RemoteFetchRequestsPerSec)"),
    ("fetch_errors", "strom_remote_fetch_errors", "Fetch reads from remote storage that failed (RemoteFetchErrorsPerSec)"),
    ("delete_requests", "strom_remote_delete_requests", "Remote segments deleted (RemoteDeleteRequestsPerSec)"),
    ("delete_errors", "strom_remote_delete_errors", "Remote segment deletions that failed (RemoteDeleteErrorsPerSec)"),
)
# Kafka's per-topic remote gauges: the attribute of a PartitionTiering, the metric, its doc.
REMOTE_GAUGES = (
    ("copy_lag_bytes", "remote_copy_lag_bytes",
     "Bytes of rolled local segments not yet in remote storage (RemoteCopyLagBytes)"),
    ("copy_lag_segments", "remote_copy_lag_segments",
     "Rolled local segments not yet in remote storage (RemoteCopyLagSegments)"),
    ("remote_size_bytes", "remote_log_size_bytes", "Bytes of the segments in remote storage (RemoteLogSizeBytes)"),
    ("remote_segments", "remote_log_segments",
     "Segments in remote storage, by their metadata (RemoteLogMetadataCount)"),
)


def remote_families(manager: Any, partitions: dict) -> Iterator[Any]:
    """Tiered storage (KIP-405): the RemoteLogManager's counters, and per topic the copy lag and
    remote size of the tiered partitions this broker leads (as Kafka, whose leader reports
    them: summed over brokers they count each partition once). All 0, and no per-topic series,
    without remote.log.storage.system.enable."""
    stats = manager.stats if manager is not None else None
    for attr, name, doc in REMOTE_COUNTERS:
        yield CounterMetricFamily(name, doc, value=getattr(stats, attr) if stats is not None else 0)
    yield _gauge("strom_remote_storage_unavailable",
                 "1 after a remote store call failed, until a segment copy succeeds again",
                 int(stats.store_unavailable) if stats is not None else 0)
    per_topic: dict[str, list[int]] = {}
    for (_, topic, index), state in (manager.tiered.items() if manager is not None else ()):
        partition = partitions.get((topic, index))
        if partition is None or not partition.is_leader:
            continue
        sums = per_topic.setdefault(topic, [0] * len(REMOTE_GAUGES))
        for i, (attr, _, _) in enumerate(REMOTE_GAUGES):
            sums[i] += getattr(state, attr)
    for i, (_, name, doc) in enumerate(REMOTE_GAUGES):
        family = GaugeMetricFamily(f"strom_topic_{name}", f"{doc}, per topic", labels=["topic"])
        for topic, sums in sorted(per_topic.items()):
            family.add_metric([topic], sums[i])
        yield family
        yield _gauge(f"strom_{name}", f"{doc}, all topics", sum(sums[i] for sums in per_topic.values()))


def _group_families(broker: Any) -> Iterator[Any]:
    coordinator = broker.group_coordinator
    if coordinator is None:
        return
    states = GaugeMetricFamily("strom_groups", "Groups this broker coordinates, per state",
                               labels=["state"])
    by_state = Counter(g.state_name for g in coordinator.groups.values())
    for state, count in sorted(by_state.items()):
        states.add_metric([state], count)
    yield states
    lag = GaugeMetricFamily("strom_consumer_group_lag",
                            "High watermark minus committed offset, for the partitions of coordinated "
                            "groups this broker holds a replica of", labels=["group", "topic", "partition"])
    offsets = 0
    partitions = broker.replica_manager.partitions
    for group_id, group in coordinator.groups.items():
        offsets += len(group.offsets)
        for tp, committed in group.offsets.items():
            partition = partitions.get(tp)
            if partition is not None:
                lag.add_metric([group_id, tp[0], str(tp[1])],
                               max(0, partition.high_watermark - committed.offset))
    yield _gauge("strom_group_offsets", "Committed offsets held by this broker's coordinator (NumOffsets)", offsets)
    yield lag


def _share_dead_letter_families(manager: Any) -> Iterator[Any]:
    """Share groups' dead letters (KIP-1191's design) this broker wrote as the data leader, and
    the records it archived without one (the group's topic refused them)."""
    writer = getattr(manager, "dead_letter_writer", None)
    if writer is None:
        return
    for name, help_, counts in (
            ("strom_share_dead_letter_records", "Dead letters written to share groups' dead-letter topics",
             writer.written),
            ("strom_share_dead_letter_records_dropped", "Records a share group archived without a dead letter: "
             "its dead-letter topic refused them (Kafka's topic rules, or the write)", writer.dropped)):
        family = CounterMetricFamily(name, help_, labels=["group", "topic"])
        for (group, topic), count in sorted(counts.items()):
            family.add_metric([group, topic], count)
        yield family


def _network_families(socket_server: Any) -> Iterator[Any]:
    open_ = GaugeMetricFamily("strom_connections", "Open client connections", labels=["listener"])
    counts = Counter(c.listener for c in socket_server.connections)
    for listener in sorted(set(socket_server.bound) | set(counts)):  # 0 where none is open
        open_.add_metric([listener], counts[listener])
    yield open_
    for name, counts, doc in (("created", socket_server.connections_created, "Connections accepted"),
                              ("closed", socket_server.connections_closed, "Connections closed")):
        family = CounterMetricFamily(f"strom_connections_{name}", doc, labels=["listener"])
        for listener, count in sorted(counts.items()):
            family.add_metric([listener], count)
        yield family
    yield _gauge("strom_request_queue_size", "Requests received and not yet started",
                 sum(len(c.queue) for c in socket_server.connections))
    yield _gauge("strom_requests_in_flight", "Requests being answered", socket_server.in_flight)
    pool = socket_server.request_memory
    yield _gauge("strom_request_memory_available_bytes",
                 "What queued.max.request.bytes has left for large requests (-1: unbounded)",
                 pool.capacity - pool.used if pool.capacity > 0 else -1)
    if socket_server.loop_idle is not None:
        yield _gauge("strom_network_processor_avg_idle_ratio",
                     "Share of time the event loop was idle (NetworkProcessorAvgIdlePercent / 100)",
                     socket_server.loop_idle.idle_ratio)


def client_telemetry_families(telemetry: Any) -> Iterator[Any]:
    """What clients push (KIP-714): the latest value of each metric data point, per client
    instance, and the bookkeeping of client_telemetry.ClientTelemetry."""
    yield _gauge("strom_client_telemetry_instances", "Client instances tracked (client-metrics instance-count)",
                 len(telemetry.instances) if telemetry else 0)
    yield _gauge("strom_client_telemetry_subscriptions", "CLIENT_METRICS subscriptions (known once a client asked)",
                 len(telemetry.subscriptions) if telemetry else 0)
    yield CounterMetricFamily("strom_client_telemetry_pushes", "PushTelemetry requests accepted",
                              value=telemetry.pushes if telemetry else 0)
    errors = CounterMetricFamily("strom_client_telemetry_push_errors", "PushTelemetry requests refused, per error code",
                                 labels=["error_code"])
    for code in PUSH_ERRORS:
        errors.add_metric([str(int(code))], telemetry.push_errors.get(code, 0) if telemetry else 0)
    yield errors
    yield CounterMetricFamily("strom_client_telemetry_series_dropped",
                              "Pushed series not kept, or dropped, for the bound on series",
                              value=telemetry.series_dropped if telemetry else 0)
    if telemetry is None:  # no client has asked for its subscription yet
        return
    exported = telemetry.exported()
    values = GaugeMetricFamily("strom_client_telemetry", "Latest value of a metric a client pushed (delta "
                               "temporality: a sum is what it counted in the last push interval)",
                               labels=["client_instance_id", "name", "attributes"])
    described = ["client_id", "client_software_name", "client_software_version", "client_source_address"]
    info = GaugeMetricFamily("strom_client_telemetry_info", "A client instance that pushed metrics",
                             labels=["client_instance_id", *described])
    for inst, series in exported:
        instance_id, attrs = str(inst.instance_id), inst.attributes
        info.add_metric([instance_id] + [attrs.get(k) or "" for k in described], 1)
        for (name, attributes), value in series.items():
            values.add_metric([instance_id, name, attributes], value)
    yield values
    yield info


# --- the endpoint -------------------------------------------------------------------------

class _LoopCollector(Collector):
    """Builds a scrape's metrics on the event loop of what it measures (the broker's, or a
    dedicated controller's), for the HTTP thread."""

    def __init__(self, sections: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.sections = sections  # () -> the iterators of metric families, called on the loop
        self.loop = loop

    def collect(self) -> Iterable[Any]:
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            return self._snapshot()
        future = asyncio.run_coroutine_threadsafe(self._on_loop(), self.loop)
        return future.result(_SCRAPE_TIMEOUT_S)

    async def _on_loop(self) -> list[Any]:
        return self._snapshot()

    def _snapshot(self) -> list[Any]:
        families: list[Any] = []
        for section in self.sections():
            try:
                families.extend(section)
            except Exception as e:  # a scrape shows what it could build, the log says what not
                log.warning("metrics: %s failed: %s: %s", section.__name__, type(e).__name__, e)
        return families


def broker_sections(broker: Any) -> list[Iterator[Any]]:
    sections = [broker_families(broker), topic_families(broker.replica_manager.topic_stats)]
    if broker.socket_server.request_metrics is not None:
        sections.append(request_families(broker.socket_server.request_metrics))
    return sections


def controller_sections(server: Any) -> list[Iterator[Any]]:
    sections = [controller_node_families(server)]
    if server.socket_server.request_metrics is not None:
        sections.append(request_families(server.socket_server.request_metrics))
    return sections


class MetricsServer:
    """The Prometheus endpoint (`metrics.port`, on `metrics.host`): GET /metrics, of a broker
    or, on a dedicated controller, of the controller (`sections` builds them)."""

    def __init__(self, node: Any, sections: Any = broker_sections) -> None:
        self.node = node
        self.sections = sections
        self.registry = CollectorRegistry(auto_describe=False)
        self._httpd = None
        self.address: tuple[str, int] | None = None

    def start(self, host: str, port: int) -> None:
        """Started on the loop of the node it measures."""
        self.registry.register(_LoopCollector(lambda: self.sections(self.node), asyncio.get_running_loop()))
        self.registry.register(ProcessCollector(registry=None))
        self._httpd, _ = start_http_server(port, addr=host, registry=self.registry)
        self.address = self._httpd.server_address[:2]
        log.info("serving metrics on http://%s:%d/metrics", *self.address)

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
