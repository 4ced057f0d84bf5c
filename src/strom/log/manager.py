"""All partition logs of one broker across its log directories (Kafka's LogManager).

Owns the per-directory files that make restarts cheap and safe: `meta.properties` (which broker
and cluster the data belongs to), the recovery-point, log-start-offset and high-watermark
(`replication-offset-checkpoint`) checkpoints, and the `.kafka_cleanshutdown` marker that lets
start-up trust the indexes instead of re-scanning logs.

A log dir that fails (an I/O error anywhere in it, or unusable at start-up) goes offline, as
with Kafka's LogDirFailureChannel: its logs answer KAFKA_STORAGE_ERROR, nothing more is
written there, and the broker keeps serving the partitions of the other dirs.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from strom.log.checkpoint import (
    CoalescedWrite,
    read_checkpoint,
    read_flushed_ends,
    write_checkpoint,
    write_flushed_ends,
)
from strom.log.config import LONG_MAX, LogConfig
from strom.log.flusher import LogFlusher
from strom.log.index import READ_THREADS, fsync_path, in_parallel
from strom.log.leader_epoch import LeaderEpochCache
from strom.log.log import Log, parse_log_dir_name, wall_clock_ms
from strom.log.syncfs import can_sync_whole, sync_whole
from strom.protocol.errors import StorageError

log = logging.getLogger(__name__)

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "replication-offset-checkpoint"
# Strom's own, beside the recovery points: for each log flushed to its end, where that end is
# in bytes (active segment base offset and size). After a crash a log whose active segment has
# that size and no segment after it got nothing since the flush: it opens without recovery.
FLUSHED_END_CHECKPOINT = "flushed-end-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
META_PROPERTIES = "meta.properties"
DELETE_DIR_SUFFIX = "-delete"
LOCK_FILE = ".lock"
MIN_FREE_AFTER_ENOSPC = 4 << 20  # bytes a dir that hit ENOSPC needs free before writing again
SPACE_CHECK_BYTES = 1 << 20  # appended bytes between free-space checks, at least
LONG_FUTURE = 2**62  # a time after every pending deletion's delay
FUTURE_DIR_SUFFIX = "-future"  # a replica being moved to another log dir (AlterReplicaLogDirs)

TopicPartition = tuple[str, int]


def stable_items(d: dict) -> list:
    """`d`'s items, read from a worker thread while the event loop may change `d`. The copy
    runs no Python code; `list(d.items())` makes a tuple per item, which can start the garbage
    collector, whose callbacks and finalizers are Python code that lets the loop's thread in
    mid-walk ("dictionary changed size during iteration", seen at 30,000 partitions)."""
    return list(d.copy().items())


def new_cluster_id() -> str:
    """A random id in Kafka's Uuid text form: 16 bytes, url-safe base64, no padding."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):  # Kafka avoids ids that look like command-line flags
            return text


def read_properties(path: Path) -> dict[str, str]:
    """The `key=value` subset of java properties that meta.properties uses."""
    props: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file: restore it, or remove it if this log dir "
                         "holds no data worth keeping (a new one is then written)") from None
    for raw in text.splitlines():
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
    fsync_path(path.parent)


def make_durable_dir(d: Path) -> None:
    """mkdir -p, fsyncing the parent of every directory created, as Kafka does for a new log
    dir: without it a power cut can take the whole directory away, fsynced files and all."""
    missing = []
    while not d.exists():
        missing.append(d)
        d = d.parent
    for new in reversed(missing):
        new.mkdir(exist_ok=True)
        fsync_path(new.parent)


def _caused_by(error: BaseException | None, codes: tuple[int, ...]) -> bool:
    while error is not None:
        if isinstance(error, OSError) and error.errno in codes:
            return True
        error = error.__cause__
    return False


def out_of_space(error: BaseException | None) -> bool:
    """True when `error`, or what caused it, is a full disk or quota: a state that passes."""
    return _caused_by(error, (errno.ENOSPC, errno.EDQUOT))


def out_of_descriptors(error: BaseException | None) -> bool:
    """True for the process's or the system's open-file limit: the operation fails, the dir
    stays (its files are fine, and descriptors come back as files and connections close)."""
    return _caused_by(error, (errno.EMFILE, errno.ENFILE))


def _unchanged_end(path: Path, point: int | None, flushed: tuple[int, int, int] | None) -> int | None:
    """After a crash: the end of a log that got nothing since it was flushed to `point` (its
    active segment has the size recorded then, and no segment was rolled after it), else None
    (the log is recovered)."""
    if point is None or flushed is None or flushed[0] != point:
        return None
    end, base, size = flushed
    prefix = os.fspath(path)
    try:
        if os.stat(f"{prefix}/{base:020d}.log").st_size != size:
            return None
    except OSError:
        return None
    if end != base and os.path.exists(f"{prefix}/{end:020d}.log"):
        return None  # rolled at its end since: the new segment may hold data
    return end


_FIRST_SEGMENT = f"{0:020d}.log"


def _never_written(path: Path) -> bool:
    """After a crash: a log directory holding only an empty first segment, as a new log is
    made (one created after the last flushed-end checkpoint). It has nothing to recover."""
    try:
        with os.scandir(path) as entries:
            found = [(e.name, e.stat().st_size) for e in entries]
    except OSError:
        return False
    return found == [(_FIRST_SEGMENT, 0)]


def _remove_dirs(dirs: list[Path]) -> None:
    in_parallel(lambda d: shutil.rmtree(d, ignore_errors=True), dirs)  # unlinks of many dirs overlap


class LogManager:
    def __init__(
        self,
        log_dirs: list[Path],
        default_config: LogConfig,
        *,
        now_ms: Callable[[], int] = wall_clock_ms,
        recovery_threads: int = 1,
    ) -> None:
        if not log_dirs:
            raise ValueError("at least one log directory is needed")
        self.log_dirs = [Path(d) for d in log_dirs]
        self.default_config = default_config
        self._now_ms = now_ms
        self._logs: dict[TopicPartition, Log] = {}
        self._locks: list[int] = []
        self._dir_of: dict[TopicPartition, Path] = {}
        self._per_dir: dict[Path, int] = dict.fromkeys(self.log_dirs, 0)  # partitions per dir
        self.broker_id: int | None = None
        self.cluster_id: str | None = None
        self.offline_dirs: dict[Path, str] = {}  # failed dir -> why
        # cordoned.log.dirs (KIP-1066): dirs that keep their logs but take no new one.
        self.cordoned_dirs: set[Path] = set()
        # Disk space guard: below `min_free_bytes` free a dir refuses writes (reads go on) until
        # space returns, instead of failing as a whole when the disk fills.
        self.min_free_bytes = 0  # log.dir.min.free.bytes
        self.low_space_dirs: dict[Path, int] = {}  # dir -> free bytes needed to write again
        # Bytes appended before the next free-space check (a fast producer may not outrun the
        # periodic one): at least SPACE_CHECK_BYTES, an eighth of min_free_bytes when larger.
        self._until_space_check = SPACE_CHECK_BYTES
        # Logs appended to since they were last seen flushed: what flush.ms looks at, instead
        # of every log every second.
        self._unflushed: dict[Log, None] = {}
        # Logs without files yet (Log.create), by topic: made together on a first write.
        self._unmade: dict[str, dict[TopicPartition, Log]] = {}
        self._compacted: dict[TopicPartition, Log] = {}  # cleanup.policy has compact: the cleaner's
        self._descriptors_warned = -10.0
        self.dir_failure_listeners: list[Callable[[Path, str], None]] = []
        self.flusher = LogFlusher(self.handle_io_error, now_ms)
        # tp -> high watermark, read when writing replication-offset-checkpoint (ReplicaManager's).
        self.high_watermarks: Callable[[], Mapping[TopicPartition, int]] | None = None
        # Changes whenever a high watermark may have (the ReplicaManager's clock); with the
        # logs' layout, what the last complete high-watermark checkpoint was written at.
        self.high_watermarks_version: Callable[[], int] = lambda: -1
        self._layout = 0  # ticks when a log is added, removed or moved
        self.new_logs_expected = True  # see get_or_create_log
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        # Set when the broker begins to stop: logs not read yet stay unread (closing one costs
        # nothing, and it is as the last clean shutdown left it).
        self.background_load_stopped = False
        # Leader epoch checkpoints changed on the loop, written together from a thread.
        self._epoch_pending: dict[LeaderEpochCache, None] = {}
        self._epoch_writer: asyncio.Task | None = None
        # One writer per checkpoint file name at a time, computing what it writes once it
        # holds the lock: two racing writers would otherwise share a temp file, or the older
        # state could land last (a log start offset moving back after DeleteRecords).
        self._checkpoint_locks: dict[str, threading.Lock] = {}
        self._checkpoint_warned: dict[Path, float] = {}
        self._last_written: dict[Path, dict] = {}  # each checkpoint file's entries, as last written
        self._checkpointed_at: dict[str, tuple] = {}  # checkpoint name -> what it was written at
        # After DeleteRecords: requests that arrive together share one write.
        self.log_start_offsets_checkpointed = CoalescedWrite(self.checkpoint_log_start_offsets)
        self.recovery_threads = recovery_threads  # num.recovery.threads.per.data.dir
        # Flushed ends read at start-up, kept for logs still unread when checkpoints are written.
        self._flushed_ends: dict[TopicPartition, tuple[int, int, int]] = {}
        # Logs found at start-up with all they had: a clean shutdown, or nothing written since
        # their last flush. A restarted leader of any other log starts a new leader epoch.
        self._intact: set[TopicPartition] = set()
        # Told how many lazily opened logs a background batch read (the broker settles its heap).
        self.on_loaded: Callable[[int], None] = lambda _count: None
        self._doomed: list[Path] = []  # directories of deleted logs, renamed, to remove
        self._remover: asyncio.Task | None = None

    # -- start-up

    def startup(
        self,
        broker_id: int,
        cluster_id: str | None = None,
        config_for: Callable[[str], LogConfig] | None = None,
    ) -> str:
        """Check/write meta.properties, then load every log; returns the cluster id.

        A dir that cannot be created, read or written goes offline instead of failing the
        start-up, unless every dir does (Kafka's createAndValidateLogDirs)."""
        try:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        except RuntimeError:
            self._loop = None
        for d in self.log_dirs:
            try:
                make_durable_dir(d)
                probe = d / ".strom-write-probe"
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as e:
                self.mark_dir_offline(d, e)
        if not self.live_dirs:
            raise OSError(f"none of the log dirs {[str(d) for d in self.log_dirs]} is usable: "
                          f"{'; '.join(self.offline_dirs.values())}")
        self.broker_id = broker_id
        self.cluster_id = self._check_meta(broker_id, cluster_id)
        config_for = config_for or (lambda _topic: self.default_config)
        started = time.monotonic()
        for d in self.live_dirs:
            try:
                self._load_dir(d, config_for)
            except OSError as e:
                self.mark_dir_offline(d, e)
        if not self.live_dirs:
            raise OSError("every log dir failed while loading logs")
        log.info(
            "loaded %d logs from %d log dir(s) in %.2fs",
            len(self._logs), len(self.live_dirs), time.monotonic() - started,
        )
        return self.cluster_id

    def _check_meta(self, broker_id: int, cluster_id: str | None) -> str:
        found: dict[Path, dict[str, str]] = {}
        for d in self.live_dirs:
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
        for d in self.live_dirs:
            props = found.get(d, {})
            if any(props.get(k) != v for k, v in wanted.items()):
                try:
                    write_properties(d / META_PROPERTIES, {**props, **wanted})
                except OSError as e:
                    self.mark_dir_offline(d, e)
        return result

    def _load_dir(self, d: Path, config_for: Callable[[str], LogConfig]) -> None:
        marker = d / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        recovery_points = read_checkpoint(d / RECOVERY_POINT_CHECKPOINT)
        start_offsets = read_checkpoint(d / LOG_START_OFFSET_CHECKPOINT)
        # Read after a clean shutdown too: the lazily opened logs keep their entries, so that a
        # crash soon after this start-up does not recover every log not read by then.
        flushed_ends = read_flushed_ends(d / FLUSHED_END_CHECKPOINT)
        with os.scandir(d) as entries:
            names = sorted(e.name for e in entries if e.is_dir())
        to_recover: list[tuple[TopicPartition, Path, LogConfig, int, int]] = []
        lazily = 0
        for name in names:
            path = d / name
            if name.endswith(DELETE_DIR_SUFFIX):
                log.info("removing %s left by an interrupted topic deletion", path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            if name.endswith(FUTURE_DIR_SUFFIX):
                log.info("removing %s left by an interrupted move between log dirs", path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            try:
                topic, partition = parse_log_dir_name(name)
            except ValueError:
                continue  # not a partition directory
            key = (topic, partition)
            if key in self._logs:
                raise ValueError(f"duplicate log directories for {topic}-{partition}: {path}")
            point = recovery_points.get(key)
            end = point if clean else _unchanged_end(path, point, flushed_ends.get(key))
            intact = end is not None
            if end is None and not point and key not in flushed_ends and _never_written(path):
                # Made since the last checkpoints and never written (kill -9 soon after a large
                # creation): nothing to recover, but nothing vouches for it as intact either.
                end = 0
            if end is not None:
                # Flushed and checkpointed: its end is the recovery point, and its directory is
                # read when first needed (or by load_in_background).
                opened = Log.lazy(path, config_for(topic), log_start_offset=min(start_offsets.get(key, 0), end),
                                  log_end_offset=end, now_ms=self._now_ms)
                flushed = flushed_ends.get(key)
                if flushed is not None and flushed[0] == end:
                    self._flushed_ends[key] = flushed
                self._add(key, d, opened)
                lazily += 1
                if intact:
                    self._intact.add(key)
            else:
                to_recover.append((key, path, config_for(topic), point or 0, start_offsets.get(key, 0)))
        self._recover_logs(d, to_recover, clean)
        if clean:
            # A log the clean stop checkpointed at 0 without a directory was never written
            # (Log.create): made again empty, it has lost nothing, so its leader keeps its epoch.
            self._intact.update(key for key, point in recovery_points.items() if not point and key not in self._logs)
            # From here on a crash must be noticed: the marker only exists between a clean
            # shutdown and the next start-up.
            marker.unlink()
        elif to_recover or lazily:  # a new dir (no logs) is no crash
            log.info("%s: no clean shutdown marker, recovered unflushed segments of %d logs (%d "
                     "needed nothing: unchanged since their last flush, or never written)", d,
                     len(to_recover), lazily)

    def _recover_logs(self, d: Path, todo: list[tuple[TopicPartition, Path, LogConfig, int, int]],
                      clean: bool) -> None:
        """Open (recovering what is past each recovery point) the logs that cannot open
        lazily, on num.recovery.threads.per.data.dir threads."""
        def open_one(item: tuple[TopicPartition, Path, LogConfig, int, int]) -> Log:
            _, path, config, point, start = item
            return Log.open(path, config, recovery_point=point, log_start_offset=start,
                            clean_shutdown=clean, now_ms=self._now_ms)

        if self.recovery_threads > 1 and len(todo) > 1:
            with ThreadPoolExecutor(self.recovery_threads, thread_name_prefix="log-recovery") as pool:
                opened = list(pool.map(open_one, todo))
        else:
            opened = [open_one(item) for item in todo]
        for (key, *_), lg in zip(todo, opened, strict=True):
            self._add(key, d, lg)

    # -- logs

    def lock_dirs(self) -> None:
        """Take Kafka's `.lock` on every log dir, so a second broker on the same data refuses
        to start instead of recovering (and corrupting) the running one's files."""
        import fcntl

        for d in self.log_dirs:
            try:
                make_durable_dir(d)
                fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                continue  # an unusable dir goes offline at start-up, as before
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise OSError(f"log dir {d} is in use by another broker (it holds {d / LOCK_FILE}); "
                              "stop it or give this broker other log.dirs") from None
            self._locks.append(fd)

    def unlock_dirs(self) -> None:
        for fd in self._locks:
            os.close(fd)  # closing releases the lock
        self._locks.clear()

    def __len__(self) -> int:
        return len(self._logs)

    def found_intact(self, topic: str, partition: int) -> bool:
        """Did start-up find this log with every record it had before (so a leader that
        restarted need not start a new leader epoch for it)? Safe from any thread. A log
        never written has none until the partition's LeaderAndIsr makes it again."""
        lg = self._logs.get((topic, partition))
        return (topic, partition) in self._intact and not (lg is not None and lg.offline)

    def get_log(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def get_or_create_log(self, topic: str, partition: int, config: LogConfig | None = None) -> Log:
        """The partition's log; a new one goes to the live dir with the fewest partitions.

        While `new_logs_expected` is off (a broker's start-up, when every partition the
        controller names already exists), a partition with no log whose data may sit in an
        offline dir gets an offline placeholder (KAFKA_STORAGE_ERROR) instead of a fresh empty
        log elsewhere, which would shadow that data (Kafka refuses the same way for a
        LeaderAndIsr that is not `isNew`)."""
        key = (topic, partition)
        existing = self._existing(key, config or self.default_config)
        if existing is not None:
            return existing
        d = self._dir_for_new_log(key)
        created = self._create(d, key, config or self.default_config)
        if isinstance(created, Exception):
            raise created
        self._add(key, d, created)
        return created

    async def get_or_create_logs(self, wanted: list[tuple[TopicPartition, LogConfig]],
                                 batch: int = 500) -> dict[TopicPartition, Log | StorageError]:
        """`get_or_create_log` for many partitions (a LeaderAndIsr of a new topic): the logs
        are made in a worker thread, `batch` at a time (a new log makes no files, but a
        directory left behind is opened and may need recovery); the loop serves other
        requests in between. A partition whose log could not be made gets its StorageError."""
        out: dict[TopicPartition, Log | StorageError] = {}
        todo: list[tuple[TopicPartition, Path, LogConfig]] = []
        for key, config in wanted:
            existing = self._existing(key, config)
            if existing is not None:
                out[key] = existing
                continue
            try:
                d = self._dir_for_new_log(key)
            except StorageError as e:
                out[key] = e
                continue
            self._per_dir[d] += 1  # counted now, so the batch spreads over the dirs
            todo.append((key, d, config))
        for start in range(0, len(todo), batch):
            chunk = todo[start:start + batch]
            made = await asyncio.to_thread(self._create_many, chunk)
            for (key, d, _), created in zip(chunk, made, strict=True):
                self._per_dir[d] -= 1
                if isinstance(created, Exception):
                    out[key] = created
                elif key in self._logs:  # made meanwhile by another path: keep that one
                    created.close()
                    out[key] = self._logs[key]
                else:
                    self._add(key, d, created)
                    out[key] = created
        return out

    def _existing(self, key: TopicPartition, config: LogConfig) -> Log | None:
        """The partition's log, or, while `new_logs_expected` is off, an offline placeholder
        for one whose data may be in an offline dir."""
        existing = self._logs.get(key)
        if existing is not None or self.new_logs_expected:
            return existing
        name = f"{key[0]}-{key[1]}"
        for d in self.offline_dirs:
            try:
                present = name in os.listdir(d)
            except OSError:
                present = True  # cannot tell: assume the data is there
            if present:
                placeholder = Log(d / name, config, [], log_start_offset=0, log_end_offset=0,
                                  recovery_point=0, now_ms=self._now_ms)
                placeholder.go_offline()
                self._logs[key] = placeholder
                self._dir_of[key] = d
                self._layout += 1
                return placeholder
        return None

    def _dir_for_new_log(self, key: TopicPartition) -> Path:
        live = self.live_dirs
        if not live:
            raise StorageError(f"cannot create log {key[0]}-{key[1]}: every log dir is offline")
        open_dirs = [d for d in live if d not in self.cordoned_dirs]
        if not open_dirs:
            raise StorageError(f"cannot create log {key[0]}-{key[1]}: every live log dir is cordoned "
                               "(cordoned.log.dirs)")
        return min(open_dirs, key=self._per_dir.__getitem__)

    def _create(self, d: Path, key: TopicPartition, config: LogConfig) -> Log | StorageError:
        """Make a new log in `d` (any thread); the error to answer if it cannot be made. It has
        no files until its first write (Log.create), unless its directory is there already
        (left behind by a run that did not load it): then that is opened."""
        name = f"{key[0]}-{key[1]}"
        try:
            path = d / name
            if not os.path.lexists(path):
                return Log.create(path, config, now_ms=self._now_ms)
            return Log.open(path, config, now_ms=self._now_ms)
        except OSError as e:
            if out_of_space(e) or out_of_descriptors(e):
                shutil.rmtree(d / name, ignore_errors=True)  # a half-made log is not kept
            self.dir_failed(d, e)
            return StorageError(f"cannot create log {name} in {d}: {e}")

    def _create_many(self, todo: list[tuple[TopicPartition, Path, LogConfig]]) -> list[Log | StorageError]:
        return [self._create(d, key, config) for key, d, config in todo]

    def make_files(self, logs: list[Log]) -> None:
        """Make the files of logs without any yet (Log.make_files), a few threads at a time,
        then fsync each log dir once for the new directories' names (a flush would otherwise
        fsync it once per log). Blocking: for a worker thread. What fails is left for the
        write, which makes the files itself and reports the error."""
        def make(lg: Log) -> None:
            try:
                lg.make_files()
            except (OSError, StorageError):
                pass

        in_parallel(make, logs, READ_THREADS)
        by_dir: dict[Path, list[Log]] = {}
        for lg in logs:
            by_dir.setdefault(lg.dir.parent, []).append(lg)
        for d, group in by_dir.items():
            # Only the directories made before the fsync: one whose making failed here may be
            # made by its write meanwhile, after the fsync, and its own flush must sync for it.
            made = [lg for lg in group if lg.dir_made]
            try:
                fsync_path(d)
            except OSError:
                continue  # each log's flush fsyncs it, and meets the error there
            for lg in made:
                lg.parent_synced()

    def unmade_alongside(self, logs: list[Log], limit: int) -> list[Log]:
        """`logs` (about to be written, without files yet) and more never-written logs of their
        topics, up to `limit` in all, for the caller to make the files of together: whoever
        writes to one new partition of a topic (a producer, a follower) is about to write to
        its others, and a few threads make many logs' files several times faster than one
        produce request at a time (librdkafka sends one partition per request)."""
        out = list(logs)
        for lg in logs:  # out of the index first: what is popped below is another log
            if (waiting := self._unmade.get(lg.topic)) is not None:
                waiting.pop((lg.topic, lg.partition), None)
        for topic in {lg.topic for lg in logs}:
            waiting = self._unmade.get(topic)
            while waiting and len(out) < limit:
                _, lg = waiting.popitem()
                if not (lg.dir_made or lg.closed):
                    out.append(lg)
            if not waiting:
                self._unmade.pop(topic, None)
        return out

    def _add(self, key: TopicPartition, d: Path, lg: Log) -> None:
        lg.flush_hook = self.flusher.request
        lg.io_error_hook = self.handle_io_error
        lg.write_refusal = self._refusal(d)
        lg.append_hook = self._appended
        lg.config_hook = self._config_changed
        if self._loop is not None:
            lg.defer_epoch_writes(self._defer_epoch_write)
        self._logs[key] = lg
        if lg.config.compact:
            self._compacted[key] = lg
        if not lg.dir_made:
            self._unmade.setdefault(key[0], {})[key] = lg
        self._dir_of[key] = d
        self._layout += 1
        self._per_dir[d] += 1

    def unflushed_logs(self) -> list[Log]:
        """Logs with data above their recovery point and a flush.ms (forgetting those flushed
        since): what the flush.ms check walks every second. Logs that never flush by time,
        Kafka's default, are not in it: 20,000 of them cost 1.5% of a core walked for nothing."""
        for lg in [lg for lg in self._unflushed if lg.closed or lg.offline or lg.unflushed_messages() <= 0]:
            del self._unflushed[lg]
        return list(self._unflushed)

    def dir_of(self, tp: TopicPartition) -> Path | None:
        return self._dir_of.get(tp)

    async def load_in_background(self, batch: int = 256) -> int:
        """Read the directories and leader epoch files of logs opened lazily, a batch at a time
        in worker threads, so that they are ready before clients need them (retention, the
        cleaner and first fetches would otherwise each load them on the loop). Returns how
        many were loaded."""
        pending = [lg for lg in self._logs.values() if not lg.fully_loaded]
        started, loaded = time.monotonic(), 0

        def load_one(lg: Log) -> None:
            try:
                lg.load()
            except OSError as e:
                self.handle_io_error(lg, e)

        def load(logs: list[Log]) -> int:
            todo = [lg for lg in logs if not (lg.closed or lg.offline or lg.fully_loaded)]
            in_parallel(load_one, todo, READ_THREADS)  # small reads of many dirs: a few at once
            return sum(lg.fully_loaded for lg in todo)

        for start in range(0, len(pending), batch):
            if self.background_load_stopped:
                break
            done = await asyncio.to_thread(load, pending[start:start + batch])
            loaded += done
            self.on_loaded(done)
        if loaded:
            log.info("read the directories of %d logs in %.2fs", loaded, time.monotonic() - started)
        return loaded

    # -- leader epoch checkpoints, written in batches

    def _defer_epoch_write(self, cache: LeaderEpochCache) -> None:
        """On the loop: `cache` changed; its file is written with the others that change in
        the same turn of the loop (a LeaderAndIsr of 10,000 partitions: one batch)."""
        if threading.get_ident() != self._loop_thread:  # a log loaded by a worker thread
            self._loop.call_soon_threadsafe(self._defer_epoch_write, cache)
            return
        self._epoch_pending[cache] = None
        if self._epoch_writer is None:
            self._epoch_writer = self._loop.create_task(self._write_epochs(), name="leader-epoch-writer")

    async def _write_epochs(self) -> None:
        try:
            while self._epoch_pending:
                await asyncio.sleep(0)  # the rest of this turn's changes join the batch
                caches = list(self._epoch_pending)
                self._epoch_pending.clear()
                await asyncio.to_thread(self._write_epoch_files, caches)
        finally:
            self._epoch_writer = None

    def _write_epoch_files(self, caches: list[LeaderEpochCache]) -> None:
        def write(cache: LeaderEpochCache) -> None:
            try:
                cache.write()
            except FileNotFoundError:
                pass  # its log was deleted meanwhile
            except OSError as e:
                d = cache.path.parent.parent
                if d in self._per_dir:
                    self.dir_failed(d, e)

        in_parallel(write, caches)

    async def write_pending_epochs(self) -> None:
        """Wait until every leader epoch change made so far is in its file."""
        while self._epoch_writer is not None:
            await asyncio.shield(self._epoch_writer)

    # -- log dir failures

    @property
    def live_dirs(self) -> list[Path]:
        return [d for d in self.log_dirs if d not in self.offline_dirs]

    def handle_io_error(self, lg: Log, error: BaseException) -> None:
        """An I/O error on `lg`: its whole log dir goes offline, unless the disk is only full
        (the write was undone; the dir refuses writes until space returns). Callable from any
        thread."""
        try:
            key: TopicPartition | None = parse_log_dir_name(lg.dir.name)
        except ValueError:  # a moving log's future dir: its parent is the dir that failed
            key = None
        d = self._dir_of.get(key) if key is not None and self._logs.get(key) is lg else None
        self.dir_failed(lg.dir.parent if d is None else d, error)

    def dir_failed(self, d: Path, error: BaseException) -> None:
        """What an I/O error in dir `d` does: a full disk makes the dir refuse writes until
        space returns, running out of descriptors fails just that operation, anything else
        takes the dir offline."""
        if out_of_space(error):
            self.mark_low_space(d)
        elif out_of_descriptors(error):
            now = time.monotonic()
            if now - self._descriptors_warned >= 10:  # one line per 10 s, however many fail
                self._descriptors_warned = now
                log.error("log dir %s: out of file descriptors (%s); operations fail, the dir "
                          "stays online", d, error)
        else:
            self.mark_dir_offline(d, error)

    def _checkpoint_failed(self, path: Path, error: OSError) -> None:
        """A checkpoint is rewritten often and whole, by rename, so the previous one stays
        valid when a write fails: only an error of the disk itself (EIO, a read-only
        filesystem) takes the dir offline; anything else fails this write, logged once a
        minute, and the next write tries again."""
        d = path.parent
        if error.errno in (errno.EIO, errno.EROFS) or out_of_space(error) or out_of_descriptors(error):
            self.dir_failed(d, error)
            return
        now = time.monotonic()
        if now - self._checkpoint_warned.get(path, -60.0) >= 60:
            self._checkpoint_warned[path] = now
            log.error("cannot write %s (%s); the previous one stays, the next write retries", path, error)

    # -- disk space

    def _free_bytes(self, d: Path) -> int | None:
        try:
            st = os.statvfs(d)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def _refusal(self, d: Path) -> str | None:
        if d not in self.low_space_dirs:
            return None
        return (f"log dir {d} is low on space: writes resume at {self.low_space_dirs[d]} free bytes "
                f"(log.dir.min.free.bytes={self.min_free_bytes})")

    def _set_refusal(self, d: Path) -> None:
        refusal = self._refusal(d)
        for tp, dd in stable_items(self._dir_of):
            lg = self._logs.get(tp)
            if dd == d and lg is not None:
                lg.write_refusal = refusal

    def _config_changed(self, lg: Log) -> None:
        """A log's config changed: the indexes by config follow (a flush.ms set on a log
        holding unflushed data is checked from now on, not from its next append)."""
        key = (lg.topic, lg.partition)
        if self._logs.get(key) is not lg:
            return
        if lg.config.compact:
            self._compacted[key] = lg
        else:
            self._compacted.pop(key, None)
        if lg.config.flush_ms < LONG_MAX and lg.unflushed_messages() > 0:
            self._unflushed[lg] = None

    def compacted_logs(self) -> list[tuple[TopicPartition, Log]]:
        """The logs whose cleanup.policy has compact: what the cleaner looks through."""
        return stable_items(self._compacted)

    def _appended(self, lg: Log, nbytes: int) -> None:
        if lg.config.flush_ms < LONG_MAX:  # the default, never: no time check needs this log
            self._unflushed[lg] = None
        self._until_space_check -= nbytes
        if self._until_space_check <= 0:
            self._until_space_check = max(SPACE_CHECK_BYTES, self.min_free_bytes // 8)
            self.check_free_space()

    def mark_low_space(self, d: Path) -> None:
        """The disk of `d` ran out (ENOSPC): refuse writes there until it has room again."""
        if d in self.low_space_dirs or d not in self._per_dir:
            return
        self.low_space_dirs[d] = max(self.min_free_bytes, MIN_FREE_AFTER_ENOSPC)
        log.error("log dir %s is out of space: writes refused, reads go on, until %d bytes are free",
                  d, self.low_space_dirs[d])
        self._set_refusal(d)

    def check_free_space(self) -> list[Path]:
        """Refuse or accept writes per live dir by its free space; returns the low dirs."""
        for d in self.live_dirs:
            free = self._free_bytes(d)
            if free is None:
                continue
            needed = self.low_space_dirs.get(d, self.min_free_bytes)
            if free < needed and d not in self.low_space_dirs:
                self.low_space_dirs[d] = needed
                log.error("log dir %s has %d bytes free, below log.dir.min.free.bytes=%d: writes "
                          "refused, reads go on", d, free, needed)
                self._set_refusal(d)
            elif free >= needed and d in self.low_space_dirs:
                del self.low_space_dirs[d]
                log.warning("log dir %s has %d bytes free again: writes accepted", d, free)
                self._set_refusal(d)
        return list(self.low_space_dirs)

    def free_space(self, dirs: list[Path]) -> None:
        """On a low dir, unlink segments already deleted (retention, truncation) without waiting
        for file.delete.delay.ms: their space is what lets writes resume."""
        for tp, d in stable_items(self._dir_of):
            lg = self._logs.get(tp)
            if d in dirs and lg is not None and not (lg.offline or lg.closed):
                try:
                    lg.purge_deleted(LONG_FUTURE)
                except OSError as e:
                    self.handle_io_error(lg, e)

    def mark_dir_offline(self, d: Path, error: BaseException | str) -> None:
        """Take log dir `d` and every partition in it offline (Kafka's handleLogDirFailure).

        Callable from worker threads: the flags are set at once (so a shutdown in progress
        skips the dir); listeners run on the event loop."""
        if d in self.offline_dirs or d not in self._per_dir:
            return
        reason = str(error) or type(error).__name__
        self.offline_dirs[d] = reason
        affected = [tp for tp, dd in stable_items(self._dir_of) if dd == d]
        for tp in affected:
            lg = self._logs.get(tp)
            if lg is not None:
                lg.go_offline()
        log.error("log dir %s failed (%s): %d partition(s) offline: %s", d, reason, len(affected),
                  ", ".join(f"{t}-{p}" for t, p in sorted(affected)[:20]))
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._notify_dir_failure, d, reason)
        else:
            self._notify_dir_failure(d, reason)

    def _notify_dir_failure(self, d: Path, reason: str) -> None:
        for listener in self.dir_failure_listeners:
            listener(d, reason)

    def future_dir(self, tp: TopicPartition, target: Path) -> Path:
        return target / f"{tp[0]}-{tp[1]}.{uuid.uuid4().hex}{FUTURE_DIR_SUFFIX}"

    def finish_move(self, tp: TopicPartition, future: Path, target: Path, config: LogConfig) -> Log:
        """The copy in `future` (complete: nothing was appended since) becomes the
        partition's log in `target`; the old directory goes as a deleted log's does."""
        old = self._logs[tp]
        final = target / old.dir.name
        os.rename(future, final)
        moved = Log.open(final, config, recovery_point=old.recovery_point,
                         log_start_offset=old.log_start_offset, now_ms=self._now_ms)
        self.delete_log(*tp)  # closes and removes the old directory
        self._add(tp, target, moved)
        return moved

    def delete_log(self, topic: str, partition: int) -> bool:
        """Delete a partition's log: rename its dir to `*-delete` first (a crash from there on
        is finished by the next start-up), then remove it. False if there was no such log."""
        key = (topic, partition)
        target_log = self._logs.pop(key, None)
        if target_log is None:
            return False
        self._compacted.pop(key, None)
        if (waiting := self._unmade.get(topic)) is not None:
            waiting.pop(key, None)
        d = self._dir_of.pop(key)
        self._per_dir[d] -= 1
        self._layout += 1
        self._intact.discard(key)
        target_log.close_epoch_cache()  # before the rename: a late write must not follow
        if target_log.close_unmade():
            return True  # never written: no directory to remove
        if d in self.offline_dirs:
            target_log.close()  # nothing can be removed from a failed dir; it stays behind
            return True
        doomed = target_log.dir.with_name(f"{target_log.dir.name}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}")
        try:
            os.rename(target_log.dir, doomed)
        except OSError as e:
            self.mark_dir_offline(d, e)
            target_log.close()
            return True
        target_log.dir = doomed
        if self._loop is None or threading.get_ident() != self._loop_thread:
            target_log.delete()
            return True
        # Removing the files is the slow part (a topic of 10,000 partitions): it happens in a
        # worker thread, many logs at a time; a crash before it is finished by the next start.
        target_log.delete(remove=False)
        self._doomed.append(doomed)
        if self._remover is None:
            self._remover = self._loop.create_task(self._remove_doomed(), name="log-deleter")
        return True

    async def _remove_doomed(self, batch: int = 500) -> None:
        try:
            while self._doomed:
                await asyncio.sleep(0)
                doomed, self._doomed = self._doomed[:batch], self._doomed[batch:]
                await asyncio.to_thread(_remove_dirs, doomed)
        finally:
            self._remover = None

    async def wait_for_deletions(self) -> None:
        """Until the directories of every log deleted so far are gone."""
        while self._remover is not None:
            await asyncio.shield(self._remover)

    def logs(self) -> Iterator[tuple[TopicPartition, Log]]:
        return iter(stable_items(self._logs))

    def topics(self) -> set[str]:
        return {topic for topic, _ in self._logs}

    # -- maintenance

    def write_per_dir(self, name: str, value: Callable[[TopicPartition, Log], int | None],
                      only_dir: Path | None = None) -> bool:
        """Write checkpoint file `name` in every live dir (or only `only_dir`) with
        `value(tp, log)` per partition (None leaves the partition out), as the file's one
        writer: what is written is computed under its lock, so the newest state lands last. A
        failed write leaves the previous file (see _checkpoint_failed); False then. Safe to
        run in a thread: it works on snapshots of the log tables."""
        return self._write_dirs(name, value, only_dir, write_checkpoint)

    def _write_dirs(self, name: str, value: Callable[[TopicPartition, Log], Any], only_dir: Path | None,
                    write: Callable[[Path, dict[TopicPartition, Any]], None]) -> bool:
        """write_per_dir for any file `write` writes from its entries."""
        lock = self._checkpoint_locks.setdefault(name, threading.Lock())
        with lock:
            logs, dir_of = stable_items(self._logs), dict(self._dir_of)
            live = [d for d in self.live_dirs if only_dir is None or d == only_dir]
            if len(live) == 1 and len(self.log_dirs) == 1:  # the common case, in one pass
                by_dir = {live[0]: {key: v for key, lg in logs if (v := value(key, lg)) is not None}}
            else:
                by_dir = {d: {} for d in live}
                for key, lg in logs:
                    entries = by_dir.get(dir_of.get(key))
                    if entries is not None:
                        v = value(key, lg)
                        if v is not None:
                            entries[key] = v
            written = True
            for d, entries in by_dir.items():
                if self._last_written.get(d / name) == entries:
                    continue  # unchanged: 100,000 partitions' lines are not rewritten for nothing
                try:
                    write(d / name, entries)
                    self._last_written[d / name] = entries
                except OSError as e:
                    written = False
                    self._checkpoint_failed(d / name, e)
            return written

    def checkpoint(self) -> None:
        """Write the recovery-point and log-start-offset checkpoints of every live log dir."""
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()

    def _unless_unmoved(self, name: str, clock: int, write: Callable[[], bool]) -> None:
        """Run `write` (True once every file is written) unless `clock`, the layout and the
        live dirs are as at the last complete write of checkpoint `name`: an idle broker
        walks none of its 100,000 logs. They are read before the walk, so that a move during
        it shows next time; a clock of -1 (unknown) always writes."""
        at = (clock, self._layout, tuple(self.live_dirs))
        if clock >= 0 and self._checkpointed_at.get(name) == at:
            return
        if write():
            self._checkpointed_at[name] = at

    def checkpoint_recovery_points(self) -> None:
        def write() -> bool:
            # Flushed ends first: one that a crash leaves newer than the recovery points only
            # names ends the recovery points do not match, which then recover as usual.
            flushed_ends = self._write_flushed_ends()
            return self.write_per_dir(RECOVERY_POINT_CHECKPOINT, lambda _k, lg: lg.recovery_point) and flushed_ends

        self._unless_unmoved(RECOVERY_POINT_CHECKPOINT, Log.offsets_clock, write)

    def _flushed_end(self, key: TopicPartition, lg: Log) -> tuple[int, int, int] | None:
        """(end offset, active segment base, its size) of a log flushed to its end, read so
        that an append racing this thread shows as a mismatch, never as a false match."""
        if not lg.loaded:
            return self._flushed_ends.get(key)
        end = lg.log_end_offset
        segment = lg.active_segment
        size = segment.size
        if lg.recovery_point != end or lg.log_end_offset != end or lg.active_segment is not segment:
            return None
        return end, segment.base_offset, size

    def _write_flushed_ends(self) -> bool:
        return self._write_dirs(
            FLUSHED_END_CHECKPOINT, lambda key, lg: None if lg.offline or lg.closed else self._flushed_end(key, lg),
            None, write_flushed_ends)

    def checkpoint_log_start_offsets(self) -> None:
        self._unless_unmoved(LOG_START_OFFSET_CHECKPOINT, Log.offsets_clock, lambda: self.write_per_dir(
            LOG_START_OFFSET_CHECKPOINT, lambda _k, lg: lg.checkpoint_start_offset))

    def checkpoint_high_watermarks(self) -> None:
        """replication-offset-checkpoint: the high watermark of each partition (Kafka's
        ReplicaManager writes it every replica.high.watermark.checkpoint.interval.ms)."""
        if self.high_watermarks is None:
            return
        def write() -> bool:
            hws = dict(self.high_watermarks())
            return self.write_per_dir(HIGH_WATERMARK_CHECKPOINT, lambda key, _lg: hws.get(key))

        self._unless_unmoved(HIGH_WATERMARK_CHECKPOINT, self.high_watermarks_version(), write)

    def read_high_watermarks(self) -> dict[TopicPartition, int]:
        """The checkpointed high watermarks of every live dir (for start-up)."""
        out: dict[TopicPartition, int] = {}
        for d in self.live_dirs:
            try:
                out.update(read_checkpoint(d / HIGH_WATERMARK_CHECKPOINT))
            except (OSError, ValueError) as e:
                log.warning("ignoring %s: %s", d / HIGH_WATERMARK_CHECKPOINT, e)
        return out

    def cleanup(self, now_ms: int | None = None) -> int:
        """Apply retention to every log and unlink deleted segments past their delay; returns
        the number of segments deleted."""
        now = self._now_ms() if now_ms is None else now_ms
        deleted = 0
        for _, lg in stable_items(self._logs):
            if lg.offline or lg.closed:
                continue
            try:
                deleted += lg.delete_retention_segments(now)
                lg.purge_deleted(now)
            except OSError as e:
                self.handle_io_error(lg, e)
        return deleted

    def flush_dirty(self, every: bool = False, logs: Iterable[Log] | None = None) -> None:
        """fsync logs (all, or those of `logs`) with data above their recovery point (`every`:
        and whatever else a log wrote without an fsync, as its leader epoch checkpoint),
        FSYNC_THREADS at a time. Blocking: run it in a thread."""
        def flush(lg: Log) -> None:
            try:
                lg.flush()
            except OSError as e:
                self.handle_io_error(lg, e)

        todo = [lg for lg in (list(self._logs.values()) if logs is None else logs)
                if not (lg.offline or lg.closed) and (lg.log_end_offset > lg.recovery_point or (every and lg.loaded))]
        in_parallel(flush, todo)

    def _prepare_sync_whole(self, lg: Log) -> None:
        try:
            lg.prepare_sync_whole()
        except OSError as e:
            self.handle_io_error(lg, e)

    def _sync_whole(self, d: Path) -> bool:
        try:
            sync_whole(d)
            return True
        except OSError as e:  # not marked clean: its logs recover from their recovery points
            log.error("cannot sync %s at shutdown: %s", d, e)
            return False

    def _close(self, lg: Log) -> None:
        try:
            lg.close()
        except OSError as e:
            self.handle_io_error(lg, e)

    def shutdown(self) -> None:
        """Flush, checkpoint and close everything, then mark each live dir as cleanly shut
        down. Blocking: run it in a thread once nothing appends any more.

        Logs are flushed FSYNC_THREADS at a time: the filesystem commits concurrent fsyncs
        together, so 10,000 logs with unflushed data stop in seconds, not minutes. A dir whose
        filesystem can be synced whole (see syncfs.py) is flushed by one syncfs instead, once
        its logs have written what a flush would fsync, and once more after they are closed.
        Closing seals a log's active segment, which writes its index files."""
        placed = [(lg, self._dir_of.get(key)) for key, lg in self._logs.items()]
        logs = [lg for lg, _ in placed]
        whole = {d for d in self.live_dirs if can_sync_whole(d)}
        in_whole = [(lg, d) for lg, d in placed if d in whole and not (lg.offline or lg.closed)]
        self.flush_dirty(every=True, logs=[lg for lg, d in placed if d not in whole])
        in_parallel(self._prepare_sync_whole, [lg for lg, _ in in_whole if lg.epoch_file_behind()])
        unsynced = {d for d in whole if not self._sync_whole(d)}
        for lg, d in in_whole:
            if d not in unsynced and not lg.offline:
                lg.synced_whole()
        self.checkpoint()
        self.checkpoint_high_watermarks()
        in_parallel(self._close, logs)  # each seals its active segment: file writes
        unsynced |= {d for d in whole - unsynced if not self._sync_whole(d)}
        for d in self.live_dirs:
            if d in unsynced:
                continue
            try:
                (d / CLEAN_SHUTDOWN_FILE).touch()
                fd = os.open(d, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                log.error("cannot mark %s as cleanly shut down: %s", d, e)
        self._logs.clear()
        self._dir_of.clear()
        self._per_dir = dict.fromkeys(self.log_dirs, 0)
