"""Makes `format("strom")` work in any PySpark 4 session once Strom is installed: PySpark's
data source lookup imports every top-level `pyspark_*` module and registers its
`DefaultSource` under the source's name."""

from strom.spark.source import StromDataSource as DefaultSource

__all__ = ["DefaultSource"]
