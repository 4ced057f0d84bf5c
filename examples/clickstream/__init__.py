"""Reference pipeline: click events as JSON into Strom, a Structured Streaming job that counts
clicks per page per 10-second window, results back to a Strom topic and to Parquet."""
