"""What Spark's JVM decides for every Python data source, settled in the driver's PySpark for
the `strom` format only, where the user calls it (installed when `strom.spark` is imported):

- save modes: Spark's Kafka sink takes `df.write...save()` with no mode: its default,
  ErrorIfExists, means append there, as does an explicit "error"; Ignore and Overwrite are
  refused. Spark's JVM refuses ErrorIfExists and Ignore for every Python data source before
  any Python code runs, so the default mode is chosen here.
- output modes: Python streaming writers take append and complete only; Spark finds out
  after start() returned, in the query's thread ("does not support Update mode"). Refused
  here, at start(), with the foreachBatch recipe.
- transactionalIdPrefix on `df.write` belongs inside a streaming query's foreachBatch;
  refused at save() anywhere else.
- a `strom` format Spark cannot find (DATA_SOURCE_NOT_FOUND, nothing more) is explained: the
  interpreter Spark's Python workers run does not have Strom.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

FORMAT = "strom"
APPEND_MODES = {None, "append", "error", "errorifexists", "default"}
IGNORE_REFUSED = ("Save mode Ignore is not allowed for the strom sink, as for Spark's Kafka sink: "
                  "allowed modes are append and errorifexists (the default; both append)")


def update_refused(options: dict[str, Any]) -> str:
    """The refusal of update mode, with the recipe filled in with the query's own address and
    topic (never its other options: they may hold secrets)."""
    servers = options.get("kafka.bootstrap.servers", "host:9092")
    topic = options.get("topic", "<topic>")
    return (
        "Output mode update is not supported by the strom sink: PySpark's Python streaming writers take "
        "append and complete only. For a query without aggregation, outputMode(\"append\") writes the same "
        "rows. For an aggregation, write each micro-batch with foreachBatch, exactly-once with a "
        "transactionalIdPrefix (unique per query, kept across its restarts):\n"
        "    import strom.spark\n"
        "    query = (counts.writeStream.outputMode(\"update\")\n"
        f"             .foreachBatch(strom.spark.foreach_batch(**{{\"kafka.bootstrap.servers\": \"{servers}\", "
        f"\"topic\": \"{topic}\", \"transactionalIdPrefix\": \"<query name>\"}}))\n"
        "             .option(\"checkpointLocation\", ...).start())")


def lookup_failure(context: Any) -> str:
    """Why Spark's data source lookup did not find `strom`. Spark runs the lookup (and the
    planning of Python data sources) in the interpreter the driver JVM's environment names:
    PYSPARK_DRIVER_PYTHON, else PYSPARK_PYTHON, else python3 (spark.pyspark.python is for
    executors only)."""
    env = context._jvm.java.lang.System.getenv
    python = env("PYSPARK_DRIVER_PYTHON") or env("PYSPARK_PYTHON") or "python3"
    try:
        found = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('pyspark_strom').origin)"],
                               capture_output=True, text=True, timeout=60)
        where = (f"which has Strom ({found.stdout.strip()})" if found.returncode == 0
                 else "which does not have Strom (no module pyspark_strom)")
    except (OSError, subprocess.TimeoutExpired) as e:
        where = f"which cannot be run here ({e})"
    return (f"Spark found no data source 'strom': it looks data sources up with {python!r} "
            f"(PYSPARK_DRIVER_PYTHON, else PYSPARK_PYTHON, else python3, when Spark started), {where}. "
            f"Start Spark with PYSPARK_PYTHON={sys.executable} (this driver's interpreter) in the "
            f"environment (`strom spark-submit` sets it), or install Strom with its Spark extra in {python!r} (pip install 'strom[spark]'), "
            "or call strom.spark.register(spark).")


def _explain_lookup(cls: type, name: str) -> None:
    """`cls.name` (a load/save/start) re-raises Spark's bare DATA_SOURCE_NOT_FOUND for the
    strom format with the reason."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except Exception as e:
            if "DATA_SOURCE_NOT_FOUND" not in str(e) or "strom" not in str(e):
                raise
            try:
                context = self._spark.sparkContext
            except Exception:  # noqa: BLE001 - no SparkContext here (Spark Connect)
                raise e from None
            raise RuntimeError(lookup_failure(context)) from e

    setattr(cls, name, wrapper)


def _track_options(cls: type) -> None:
    """Remember the options given to a writer, by lower-cased name (as Spark reads them)."""
    original_option, original_options = cls.option, cls.options

    @functools.wraps(original_option)
    def option(self: Any, key: str, value: Any) -> Any:
        self._strom_options = {**getattr(self, "_strom_options", {}), key.lower(): value}
        return original_option(self, key, value)

    @functools.wraps(original_options)
    def options(self: Any, **options: Any) -> Any:
        self._strom_options = {**getattr(self, "_strom_options", {}),
                               **{k.lower(): v for k, v in options.items()}}
        return original_options(self, **options)

    cls.option, cls.options = option, options


def _track_format(cls: type) -> None:
    original_format = cls.format

    @functools.wraps(original_format)
    def format(self: Any, source: str) -> Any:  # noqa: A001 - PySpark's name
        self._strom_format = str(source).lower()
        return original_format(self, source)

    cls.format = format


def _wrapped_once(lookup: str, writer: bool = True) -> Callable[[Callable[[type], None]], Callable[[type], None]]:
    """A wrapping of a PySpark reader or writer class, done once per class (install runs again
    when Spark Connect's are loaded), after which `cls.lookup` (load, save, start) explains a
    strom format Spark cannot find. A writer's format and options are remembered first."""

    def decorate(wrap: Callable[[type], None]) -> Callable[[type], None]:
        @functools.wraps(wrap)
        def once(cls: type) -> None:
            if getattr(cls, "_strom_modes", False):
                return
            if writer:
                _track_format(cls)
                _track_options(cls)
            wrap(cls)
            _explain_lookup(cls, lookup)
            cls._strom_modes = True

        return once

    return decorate


def _apply(writer: Any, format: str | None, set_mode: Callable[[str], Any], mode: str | None,  # noqa: A002
           options: dict[str, Any]) -> None:
    """What save() or start() was given, set as format(), mode() or outputMode(), and options()
    would set it, so that the checks read it where they read those."""
    if format is not None:
        writer.format(format)
    if mode is not None:
        set_mode(mode)
    if options:
        writer.options(**options)


def _in_foreach_batch(writer: Any) -> bool:
    """Whether this thread runs a streaming query's foreachBatch function (Spark sets the
    micro-batch's id on it). Where that cannot be asked (Spark Connect), the tasks decide."""
    try:
        return writer._spark.sparkContext.getLocalProperty("streaming.sql.batchId") is not None
    except Exception:  # noqa: BLE001 - no SparkContext here
        return True


@_wrapped_once("save")
def _wrap_writer(cls: type) -> None:
    original_mode, original_save = cls.mode, cls.save

    @functools.wraps(original_mode)
    def mode(self: Any, save_mode: str | None) -> Any:
        if save_mode is not None:
            self._strom_mode = str(save_mode).lower()
        return original_mode(self, save_mode)

    @functools.wraps(original_save)
    def save(self: Any, path: str | None = None, format: str | None = None,  # noqa: A002
             mode: str | None = None, partitionBy: Any = None, **options: Any) -> Any:  # noqa: N803
        _apply(self, format, self.mode, mode, options)
        if getattr(self, "_strom_format", None) == FORMAT:
            chosen = getattr(self, "_strom_mode", None)
            if chosen == "ignore":
                raise ValueError(IGNORE_REFUSED)
            if chosen in APPEND_MODES:
                self.mode("append")
            if getattr(self, "_strom_options", {}).get("transactionalidprefix") and not _in_foreach_batch(self):
                from strom.spark.txn import OUTSIDE_A_QUERY

                raise ValueError(OUTSIDE_A_QUERY)
        return original_save(self, path, None, None, partitionBy)

    cls.mode, cls.save = mode, save


@_wrapped_once("start")
def _wrap_stream_writer(cls: type) -> None:
    original_output_mode, original_start = cls.outputMode, cls.start

    @functools.wraps(original_output_mode)
    def outputMode(self: Any, output_mode: str) -> Any:  # noqa: N802 - PySpark's name
        self._strom_output_mode = str(output_mode).lower()
        return original_output_mode(self, output_mode)

    def not_strom(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            self._strom_format = None  # foreach / foreachBatch replace the format
            return original(self, *args, **kwargs)

        return wrapper

    @functools.wraps(original_start)
    def start(self: Any, path: str | None = None, format: str | None = None,  # noqa: A002
              outputMode: str | None = None, partitionBy: Any = None, queryName: str | None = None,  # noqa: N803
              **options: Any) -> Any:
        _apply(self, format, self.outputMode, outputMode, options)
        if getattr(self, "_strom_format", None) == FORMAT and getattr(self, "_strom_output_mode", None) == "update":
            raise ValueError(update_refused(getattr(self, "_strom_options", {})))
        return original_start(self, path, None, None, partitionBy, queryName)

    cls.outputMode, cls.start = outputMode, start
    cls.foreach, cls.foreachBatch = not_strom(cls.foreach), not_strom(cls.foreachBatch)


@_wrapped_once("load", writer=False)
def _wrap_reader(cls: type) -> None:
    """A reader needs only its lookup explained."""


def use_this_python(environ: Any = os.environ) -> bool:
    """Name this interpreter (which has Strom) in PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON when
    neither is set and no Spark JVM runs yet for this process, and say whether it did. The JVM
    PySpark is about to start reads them once, to look data sources up and plan them, and to run
    its Python workers; left unset, Spark runs `python3` from PATH, where Strom is seldom
    installed. A driver that a JVM started (spark-submit) has its JVM already: nothing to do."""
    if environ.get("PYSPARK_PYTHON") or environ.get("PYSPARK_DRIVER_PYTHON") or environ.get("PYSPARK_GATEWAY_PORT"):
        return False
    context = sys.modules.get("pyspark.context")
    if context is not None and getattr(context.SparkContext, "_gateway", None) is not None:
        return False
    environ["PYSPARK_PYTHON"] = environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return True


def install() -> None:
    """Teach PySpark's writers (classic, and Spark Connect's when it is loaded) the strom
    sink's modes. Connect's modules are not imported here: without its extra dependencies,
    importing them exits the interpreter."""
    from pyspark.sql.readwriter import DataFrameReader, DataFrameWriter
    from pyspark.sql.streaming.readwriter import DataStreamReader, DataStreamWriter

    _wrap_writer(DataFrameWriter)
    _wrap_stream_writer(DataStreamWriter)
    _wrap_reader(DataFrameReader)
    _wrap_reader(DataStreamReader)
    connect = sys.modules.get("pyspark.sql.connect.readwriter")
    if connect is not None:
        _wrap_writer(connect.DataFrameWriter)
    connect_stream = sys.modules.get("pyspark.sql.connect.streaming.readwriter")
    if connect_stream is not None:
        _wrap_stream_writer(connect_stream.DataStreamWriter)
