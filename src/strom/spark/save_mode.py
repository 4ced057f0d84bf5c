"""Spark's Kafka sink takes `df.write...save()` with no mode: its default, ErrorIfExists, means
append there, as does an explicit "error"; Ignore and Overwrite are refused. Spark's JVM
writer refuses ErrorIfExists and Ignore for every Python data source before any Python code
runs, so the default mode is settled where it is chosen: in PySpark's DataFrameWriter, for the
`strom` format only. Installed when `strom.spark` is imported."""

from __future__ import annotations

import functools
import sys
from typing import Any

FORMAT = "strom"
APPEND_MODES = {None, "append", "error", "errorifexists", "default"}
IGNORE_REFUSED = ("Save mode Ignore is not allowed for the strom sink, as for Spark's Kafka sink: "
                  "allowed modes are append and errorifexists (the default; both append)")


def _wrap(cls: type) -> None:
    if getattr(cls, "_strom_save_mode", False):
        return
    original_format, original_mode, original_save = cls.format, cls.mode, cls.save

    @functools.wraps(original_format)
    def format(self: Any, source: str) -> Any:  # noqa: A001 - PySpark's name
        self._strom_format = str(source).lower()
        return original_format(self, source)

    @functools.wraps(original_mode)
    def mode(self: Any, save_mode: str | None) -> Any:
        if save_mode is not None:
            self._strom_mode = str(save_mode).lower()
        return original_mode(self, save_mode)

    @functools.wraps(original_save)
    def save(self: Any, path: str | None = None, format: str | None = None,  # noqa: A002
             mode: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if format is not None:
            self.format(format)
        if mode is not None:
            self.mode(mode)
        if getattr(self, "_strom_format", None) == FORMAT:
            chosen = getattr(self, "_strom_mode", None)
            if chosen == "ignore":
                raise ValueError(IGNORE_REFUSED)
            if chosen in APPEND_MODES:
                self.mode("append")
        return original_save(self, path, None, None, *args, **kwargs)

    cls.format, cls.mode, cls.save = format, mode, save
    cls._strom_save_mode = True


def install() -> None:
    """Teach PySpark's DataFrameWriter (classic, and Spark Connect's when it is loaded) the
    strom sink's save modes. Connect's module is not imported here: without its extra
    dependencies, importing it exits the interpreter."""
    from pyspark.sql.readwriter import DataFrameWriter

    _wrap(DataFrameWriter)
    connect = sys.modules.get("pyspark.sql.connect.readwriter")
    if connect is not None:
        _wrap(connect.DataFrameWriter)
