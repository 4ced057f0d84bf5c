"""Makes `format("strom")` work in any PySpark 4 session once Strom is installed: PySpark's
data source lookup imports every top-level `pyspark_*` module and registers its
`DefaultSource` under the source's name.

The lookup gives up on all Python data sources when one such import fails, and Spark then
reports only that no "strom" source exists. So this module never fails: when the connector
cannot work in the interpreter Spark's workers run (a dependency is missing), it offers a
`strom` source that says why on first use. The dependencies are looked for, not imported:
the lookup runs in every session that uses any Python data source."""

from __future__ import annotations

from importlib.util import find_spec

# The third-party packages strom.spark imports beyond PySpark, itself or through the Strom
# modules it shares: the `spark` extra and those of Strom's own dependencies it uses
# (kafka-python's codecs; record batches' crc32c and cramjam; fastavro, protobuf, whose top
# package is `google`, and proto_schema_parser for typed columns).
NEEDS = ("pyarrow", "confluent_kafka", "aiokafka", "kafka", "crc32c", "cramjam", "fastavro", "google",
         "proto_schema_parser")

try:
    _missing = [name for name in NEEDS if find_spec(name) is None]
    if _missing:
        raise ImportError(f"No module named {_missing[0]!r}")
    from strom.spark.source import StromDataSource as DefaultSource
except ImportError as e:
    from pyspark.sql.datasource import DataSource

    _WHY = f"{type(e).__name__}: {e}"

    class DefaultSource(DataSource):  # type: ignore[no-redef]
        """Stands in for the strom source, which cannot work here."""

        @classmethod
        def name(cls) -> str:
            return "strom"

        def __init__(self, options: dict) -> None:
            import sys

            raise ImportError(
                f"The strom data source cannot be loaded in {sys.executable}, the Python that Spark's "
                f"workers run: {_WHY}. Install Strom with its Spark extra there: pip install 'strom[spark]'")

__all__ = ["DefaultSource"]
