"""Moving a replica between this broker's log dirs (AlterReplicaLogDirs) while it serves.

The partition's files are copied into `<target>/<name>.<id>-future` from a worker thread,
again and again, each pass copying only the files that changed, until a pass sees no append;
then, on the event loop and so with no append in between, the few files still changed are
copied, the copy takes the log's place and the old directory is deleted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

PASSES = 5


def copy_changed(src: Path, dst: Path, copied: dict[str, tuple[int, int]]) -> int:
    """Copy the files of `src` that differ from the last copy into `dst`; returns bytes copied."""
    dst.mkdir(parents=True, exist_ok=True)
    total = 0
    present = set()
    for entry in os.scandir(src):
        if not entry.is_file():
            continue
        st = entry.stat()
        present.add(entry.name)
        key = (st.st_size, st.st_mtime_ns)
        if copied.get(entry.name) != key:
            shutil.copyfile(entry.path, dst / entry.name)
            copied[entry.name] = key
            total += st.st_size
    for name in set(copied) - present:  # a segment deleted meanwhile (retention)
        (dst / name).unlink(missing_ok=True)
        del copied[name]
    return total


class LogDirMover:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.moving: dict[tuple[str, int], Path] = {}

    def start(self, tp: tuple[str, int], target: Path) -> None:
        if self.moving.get(tp) == target:
            return
        self.moving[tp] = target
        asyncio.get_running_loop().create_task(self._move(tp, target))

    async def _move(self, tp: tuple[str, int], target: Path) -> None:
        manager = self.broker.log_manager
        future = manager.future_dir(tp, target)
        copied: dict[str, tuple[int, int]] = {}
        try:
            for _ in range(PASSES):
                partition = self.broker.replica_manager.get_partition(*tp)
                if partition is None:
                    raise LookupError("the replica went away")
                end = partition.log.log_end_offset
                await asyncio.to_thread(partition.log.make_files)  # a directory to copy
                await asyncio.to_thread(copy_changed, partition.log.dir, future, copied)
                if self.broker.replica_manager.get_partition(*tp) is partition and \
                        partition.log.log_end_offset == end:
                    break
            partition = self.broker.replica_manager.get_partition(*tp)
            if partition is None:
                raise LookupError("the replica went away")
            # From here to the swap nothing awaits, so no append can slip in between.
            copy_changed(partition.log.dir, future, copied)
            moved = manager.finish_move(tp, future, target, partition.log.config)
            partition.replace_log(moved)
            log.info("moved %s-%d to log dir %s", *tp, target)
        except (OSError, LookupError) as e:
            log.error("moving %s-%d to %s failed: %s", *tp, target, e)
            shutil.rmtree(future, ignore_errors=True)
        finally:
            self.moving.pop(tp, None)
