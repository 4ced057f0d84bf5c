"""Metrics: what the hot path counts (stats.py), the Prometheus endpoint that reads it and the
broker's state when scraped (endpoint.py, `metrics.port`), and the metrics clients push
(client_telemetry.py, KIP-714)."""
