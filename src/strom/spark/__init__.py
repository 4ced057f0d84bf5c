"""PySpark connector: the `strom` data source, Spark's Kafka source and sink for any
Kafka-compatible broker (`format("kafka")` -> `format("strom")`).

Spark finds the source by itself once Strom is installed (the `pyspark_strom` module, which
PySpark's data source lookup imports); `register(spark)` does the same by hand. Imported before
the first session, it names this interpreter in PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON when
neither is set, so that Spark's lookup and workers run a Python that has Strom.

    spark.read.format("strom").option("kafka.bootstrap.servers", "127.0.0.1:9092") \\
        .option("subscribe", "events").load()
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from strom.spark import driver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Before a session exists: the JVM it starts runs this Python (which has Strom) for the data
# source lookup and the workers, not `python3` from PATH.
driver.use_this_python()

try:  # save and output modes, for sessions that found the source by themselves
    driver.install()
except ImportError:  # strom.spark imported where PySpark is not installed
    pass

__all__ = ["register", "local_session", "foreach_batch"]


def __getattr__(name: str) -> Any:
    if name == "foreach_batch":
        from strom.spark.sink import foreach_batch

        return foreach_batch
    raise AttributeError(name)


def register(spark: SparkSession) -> None:
    """Make `format("strom")` available in this session."""
    from strom.spark.source import StromDataSource

    spark.dataSource.register(StromDataSource)
    driver.install()


def local_session(master: str = "local[2]", app: str = "strom", **conf: Any) -> SparkSession:
    """A local SparkSession whose Python workers run this interpreter (so they can import
    strom), with the `strom` source registered. Workers pick the interpreter up from the
    environment when the JVM starts, hence before the session exists."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                        "spark.sql.shuffle.partitions": "4", **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
