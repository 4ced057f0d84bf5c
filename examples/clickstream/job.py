"""The Structured Streaming job: parse, window, count; write each micro-batch's updated counts
to a Strom topic and to Parquet, and print one progress line per micro-batch."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

EVENT = "user string, page string, ts long"


def clicks_per_page(spark: SparkSession, bootstrap: str, topic: str) -> DataFrame:
    events = (spark.readStream.format("strom")  # format("kafka") with Spark's Kafka package
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest").load())
    clicks = (events.select(F.from_json(F.col("value").cast("string"), EVENT).alias("e"))
              .select("e.page", (F.col("e.ts") / 1000).cast("timestamp").alias("time")))
    return (clicks.withWatermark("time", "10 seconds")
            .groupBy(F.window("time", "10 seconds").alias("window"), "page").count())


def start(spark: SparkSession, bootstrap: str, source: str, target: str, out: str, checkpoint: str):
    """Start the query (update mode: each micro-batch carries the windows it changed)."""

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        rows = batch.withColumn("batch", F.lit(batch_id)).cache()
        (rows.select(F.col("page").alias("key"), F.to_json(F.struct("window", "page", "count")).alias("value"))
         .write.format("strom").option("kafka.bootstrap.servers", bootstrap).option("topic", target)
         .mode("append").save())
        rows.write.mode("append").parquet(out)
        top = rows.orderBy(F.desc("count")).first()
        print(f"batch {batch_id}: {rows.count()} window counts updated"
              + (f", busiest {top.page} with {top['count']} clicks in {top.window.start:%H:%M:%S}+10s" if top else ""),
              flush=True)
        rows.unpersist()

    return (clicks_per_page(spark, bootstrap, source).writeStream.outputMode("update")
            .foreachBatch(write_batch).option("checkpointLocation", checkpoint)
            .trigger(processingTime="2 seconds").start())
