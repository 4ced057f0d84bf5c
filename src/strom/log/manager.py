"""All partition logs of one broker across its log directories (Kafka's LogManager).

Owns the per-directory files that make restarts cheap and safe: `meta.properties` (which broker
and cluster the data belongs to), the recovery-point and log-start-offset checkpoints, and the
`.kafka_cleanshutdown` marker that lets start-up trust the indexes instead of re-scanning logs.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from strom.log.checkpoint import read_checkpoint, write_checkpoint
from strom.log.config import LogConfig
from strom.log.log import Log, parse_log_dir_name, wall_clock_ms

log = logging.getLogger(__name__)

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
META_PROPERTIES = "meta.properties"
DELETE_DIR_SUFFIX = "-delete"

TopicPartition = tuple[str, int]


def new_cluster_id() -> str:
    """A random id in Kafka's Uuid text form: 16 bytes, url-safe base64, no padding."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):  # Kafka avoids ids that look like command-line flags
            return text


def read_properties(path: Path) -> dict[str, str]:
    """The `key=value` subset of java properties that meta.properties uses."""
    props: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"{path}: malformed line {raw!r}")
        props[key.strip()] = value.strip()
    return props


def write_properties(path: Path, props: dict[str, str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    stamp = time.strftime("%a %b %d %H:%M:%S %Z %Y")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"#\n#{stamp}\n")
        f.writelines(f"{k}={v}\n" for k, v in props.items())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class LogManager:
    def __init__(
        self,
        log_dirs: list[Path],
        default_config: LogConfig,
        *,
        now_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        if not log_dirs:
            raise ValueError("at least one log directory is needed")
        self.log_dirs = [Path(d) for d in log_dirs]
        self.default_config = default_config
        self._now_ms = now_ms
        self._logs: dict[TopicPartition, Log] = {}
        self._dir_of: dict[TopicPartition, Path] = {}
        self._per_dir: dict[Path, int] = dict.fromkeys(self.log_dirs, 0)  # partitions per dir
        self.broker_id: int | None = None
        self.cluster_id: str | None = None

    # -- start-up

    def startup(
        self,
        broker_id: int,
        cluster_id: str | None = None,
        config_for: Callable[[str], LogConfig] | None = None,
    ) -> str:
        """Check/write meta.properties, then load every log; returns the cluster id."""
        for d in self.log_dirs:
            d.mkdir(parents=True, exist_ok=True)
        self.broker_id = broker_id
        self.cluster_id = self._check_meta(broker_id, cluster_id)
        config_for = config_for or (lambda _topic: self.default_config)
        started = time.monotonic()
        for d in self.log_dirs:
            self._load_dir(d, config_for)
        log.info(
            "loaded %d logs from %d log dir(s) in %.2fs",
            len(self._logs), len(self.log_dirs), time.monotonic() - started,
        )
        return self.cluster_id

    def _check_meta(self, broker_id: int, cluster_id: str | None) -> str:
        found: dict[Path, dict[str, str]] = {}
        for d in self.log_dirs:
            path = d / META_PROPERTIES
            if path.exists():
                props = read_properties(path)
                if "broker.id" in props and int(props["broker.id"]) != broker_id:
                    raise ValueError(
                        f"{path}: broker.id {props['broker.id']} does not match this broker's "
                        f"id {broker_id}; the log dir belongs to another broker"
                    )
                found[d] = props
        cluster_ids = {p["cluster.id"] for p in found.values() if p.get("cluster.id")}
        if len(cluster_ids) > 1:
            raise ValueError(f"log dirs belong to different clusters: {sorted(cluster_ids)}")
        if cluster_ids and cluster_id is not None and cluster_id not in cluster_ids:
            raise ValueError(
                f"cluster id {cluster_id} does not match {cluster_ids.pop()} in meta.properties"
            )
        result = cluster_ids.pop() if cluster_ids else (cluster_id or new_cluster_id())
        wanted = {"version": "0", "broker.id": str(broker_id), "cluster.id": result}
        for d in self.log_dirs:
            props = found.get(d, {})
            if any(props.get(k) != v for k, v in wanted.items()):
                write_properties(d / META_PROPERTIES, {**props, **wanted})
        return result

    def _load_dir(self, d: Path, config_for: Callable[[str], LogConfig]) -> None:
        marker = d / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        recovery_points = read_checkpoint(d / RECOVERY_POINT_CHECKPOINT)
        start_offsets = read_checkpoint(d / LOG_START_OFFSET_CHECKPOINT)
        with os.scandir(d) as entries:
            names = sorted(e.name for e in entries if e.is_dir())
        for name in names:
            path = d / name
            if name.endswith(DELETE_DIR_SUFFIX):
                log.info("removing %s left by an interrupted topic deletion", path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            try:
                topic, partition = parse_log_dir_name(name)
            except ValueError:
                continue  # not a partition directory
            key = (topic, partition)
            if key in self._logs:
                raise ValueError(f"duplicate log directories for {topic}-{partition}: {path}")
            self._logs[key] = Log.open(
                path,
                config_for(topic),
                recovery_point=recovery_points.get(key, 0),
                log_start_offset=start_offsets.get(key, 0),
                clean_shutdown=clean,
                now_ms=self._now_ms,
            )
            self._dir_of[key] = d
            self._per_dir[d] += 1
        if clean:
            # From here on a crash must be noticed: the marker only exists between a clean
            # shutdown and the next start-up.
            marker.unlink()
        else:
            log.info("%s: no clean shutdown marker, recovered unflushed segments", d)

    # -- logs

    def get_log(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def get_or_create_log(self, topic: str, partition: int, config: LogConfig | None = None) -> Log:
        key = (topic, partition)
        existing = self._logs.get(key)
        if existing is not None:
            return existing
        d = min(self.log_dirs, key=self._per_dir.__getitem__)
        created = Log.open(
            d / f"{topic}-{partition}", config or self.default_config, now_ms=self._now_ms
        )
        self._logs[key] = created
        self._dir_of[key] = d
        self._per_dir[d] += 1
        return created

    def delete_log(self, topic: str, partition: int) -> bool:
        """Delete a partition's log: rename its dir to `*-delete` first (a crash from there on
        is finished by the next start-up), then remove it. False if there was no such log."""
        key = (topic, partition)
        target_log = self._logs.pop(key, None)
        if target_log is None:
            return False
        self._per_dir[self._dir_of.pop(key)] -= 1
        doomed = target_log.dir.with_name(f"{target_log.dir.name}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}")
        os.rename(target_log.dir, doomed)
        target_log.dir = doomed
        target_log.delete()
        return True

    def logs(self) -> Iterator[tuple[TopicPartition, Log]]:
        return iter(list(self._logs.items()))

    def topics(self) -> set[str]:
        return {topic for topic, _ in self._logs}

    # -- maintenance

    def checkpoint(self) -> None:
        """Write the recovery-point and log-start-offset checkpoints of every log dir.

        Safe to run in a thread: it works on snapshots of the log tables."""
        logs, dir_of = list(self._logs.items()), dict(self._dir_of)
        for d in self.log_dirs:
            here = [(key, lg) for key, lg in logs if dir_of.get(key) == d]
            write_checkpoint(d / RECOVERY_POINT_CHECKPOINT, {k: lg.recovery_point for k, lg in here})
            write_checkpoint(d / LOG_START_OFFSET_CHECKPOINT, {k: lg.log_start_offset for k, lg in here})

    def cleanup(self, now_ms: int | None = None) -> int:
        """Apply retention to every log and unlink deleted segments past their delay; returns
        the number of segments deleted."""
        now = self._now_ms() if now_ms is None else now_ms
        deleted = 0
        for _, lg in list(self._logs.items()):
            deleted += lg.delete_retention_segments(now)
            lg.purge_deleted(now)
        return deleted

    def flush_dirty(self) -> None:
        """fsync logs with data above their recovery point (blocking: run it in a thread)."""
        for lg in list(self._logs.values()):
            if lg.log_end_offset > lg.recovery_point:
                lg.flush()

    def shutdown(self) -> None:
        """Flush, checkpoint and close everything, then mark each dir as cleanly shut down."""
        for lg in list(self._logs.values()):
            lg.flush()
        self.checkpoint()
        for lg in self._logs.values():
            lg.close()
        for d in self.log_dirs:
            (d / CLEAN_SHUTDOWN_FILE).touch()
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._logs.clear()
        self._dir_of.clear()
        self._per_dir = dict.fromkeys(self.log_dirs, 0)
