"""Retention and the log dirs' free space: the periodic retention pass
(`log.retention.check.interval.ms`), and the disk check that refuses writes to a dir short of
space (`log.dir.min.free.bytes`) and accepts them again once it has room; while a dir is
short, retention runs at every check and deleted segments are unlinked at once."""

from __future__ import annotations

import logging

from strom.log.manager import LogManager

log = logging.getLogger(__name__)

DISK_SPACE_CHECK_MS = 1000


class LogRetention:
    def __init__(self, log_manager: LogManager) -> None:
        self.log_manager = log_manager

    def run(self) -> None:
        deleted = self.log_manager.cleanup()
        if deleted:
            log.info("retention deleted %d segments", deleted)

    def check_disk_space(self) -> None:
        low = self.log_manager.check_free_space()
        if low:
            self.run()  # first: what it deletes is then unlinked at once
            self.log_manager.free_space(low)
            self.log_manager.check_free_space()
