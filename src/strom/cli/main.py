"""The `strom` command line."""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import importlib
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from strom.config import log_levels

if TYPE_CHECKING:
    from strom.config import broker as broker_config


class _LazyGroup(click.Group):
    """Admin subcommands are imported only when used, so `strom serve` starts without them."""

    lazy = {"groups": "strom.cli.groups:groups", "configs": "strom.cli.configs:configs",
            "reassign-partitions": "strom.cli.reassign:reassign",
            "cluster": "strom.cli.cluster:cluster", "topics": "strom.cli.topics:topics",
            "produce": "strom.cli.produce:produce", "consume": "strom.cli.consume:consume",
            "get-offsets": "strom.cli.offsets:get_offsets", "dump-log": "strom.cli.dump_log:dump_log",
            "acls": "strom.cli.acls:acls", "users": "strom.cli.users:users",
            "quotas": "strom.cli.quotas:quotas", "storage": "strom.cli.storage:storage",
            "metadata-quorum": "strom.cli.metadata_quorum:metadata_quorum",
            "s3-server": "strom.cli.s3_server:s3_server",
            "leader-election": "strom.cli.leader_election:leader_election",
            "log-dirs": "strom.cli.log_dirs:log_dirs", "delete-records": "strom.cli.log_dirs:delete_records",
            "broker-api-versions": "strom.cli.api_versions:broker_api_versions",
            "features": "strom.cli.api_versions:features", "transactions": "strom.cli.transactions:transactions",
            "spark-submit": "strom.cli.spark_submit:spark_submit",
            "producer-perf-test": "strom.cli.perf_test:producer_perf_test",
            "consumer-perf-test": "strom.cli.perf_test:consumer_perf_test"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module, attr = self.lazy[name].split(":")
            command = getattr(importlib.import_module(module), attr)
            if name == "cluster":  # kafka-cluster.sh's commands join `cluster up`
                from strom.cli.cluster_tool import cluster_id, unregister

                command.add_command(cluster_id)
                command.add_command(unregister)
            _started()
            return command
        return super().get_command(ctx, name)

    def main(self, *args, **kwargs):
        # Start-up imports build many long-lived objects (the protocol codecs); collecting
        # garbage among them over and over was a fifth of a command's or a broker's start.
        gc.disable()
        try:
            return super().main(*args, **kwargs)
        finally:
            gc.enable()


def _started() -> None:
    """The command's modules are imported: what they made stays for the process's life, so it
    is kept out of later collections (gc.freeze), and collection resumes."""
    gc.freeze()
    gc.enable()


@click.group(cls=_LazyGroup)
@click.version_option(package_name="strom", prog_name="strom", message="%(prog)s %(version)s")
def main() -> None:
    """Strom: a Kafka-compatible commit log.

    The client commands (topics, produce, consume, groups, get-offsets, configs,
    reassign-partitions) share --bootstrap-server (default 127.0.0.1:9092) and --command-config
    (a client properties file). Every command exits 0 on success, 1 when the operation failed
    (one line on stderr says why) and 2 when the command line is wrong. Run `strom COMMAND
    --help` for its options and examples.
    """


@main.command()
@click.argument("properties", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Set a broker config, e.g. --override log.dirs=/tmp/strom (repeatable).")
@click.option("--log-level", metavar="SPEC",
              help="Log levels as log4j names them (TRACE, DEBUG, INFO, WARN, ERROR, FATAL, OFF): "
                   "a level for all loggers and/or LOGGER=LEVEL pairs, comma-separated, e.g. "
                   "'WARN,strom.request=DEBUG' (one line per request). Applied on top of "
                   "STROM_LOG_LEVEL; the default is INFO.")
def serve(properties: Path | None, overrides: tuple[str, ...], log_level: str | None) -> None:
    """Run a broker. With no arguments: 127.0.0.1:9092, data under ./strom-data.

    \b
    Examples:
      strom serve config/server.properties
      strom serve --override log.dirs=/var/lib/strom --override metrics.port=9404
      strom serve --log-level INFO,strom.request=DEBUG
    """
    started = time.monotonic()
    # Here, not at the top: the broker's config pulls in the storage layer, which the client
    # commands never need (each of them starts faster without it).
    from strom.config import broker as broker_config

    try:
        if properties is not None and not properties.is_file():
            raise broker_config.ConfigError(f"no such properties file: {properties}")
        cfg = broker_config.load(properties, list(overrides))
        levels = {log_levels.ROOT: logging.INFO}
        levels.update(log_levels.parse_spec(os.environ.get("STROM_LOG_LEVEL", "")))
        levels.update(log_levels.parse_spec(log_level or ""))
    except (broker_config.ConfigError, log_levels.LevelError) as e:
        click.echo(f"strom: {e}", err=True)
        sys.exit(2)
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log_levels.apply(levels)
    for handler in logging.getLogger().handlers:
        handler.addFilter(log_levels.RateLimit())
        handler.addFilter(_bounded_line)
    _raise_open_file_limit()
    _keep_large_buffers_in_heap()
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack on stderr
    try:
        import uvloop
    except ImportError:
        uvloop = None
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop and _use_uvloop() else None)
    with runner:
        sys.exit(runner.run(_serve(cfg, started)))


MAX_LOG_LINE = 2000


def _bounded_line(record: logging.LogRecord) -> bool:
    """Log lines quote what clients send (topic names, group ids): a 4 MB name must not make
    a 4 MB line. The message is cut, saying how much was left out."""
    message = record.getMessage()
    if len(message) > MAX_LOG_LINE:
        record.msg, record.args = f"{message[:MAX_LOG_LINE]}... ({len(message) - MAX_LOG_LINE} more characters)", None
    return True


def _raise_open_file_limit() -> None:
    """Each segment holds a file descriptor open, as in Kafka: take the hard limit."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def _keep_large_buffers_in_heap() -> None:
    """Produce requests arrive in ~1 MB buffers. By default glibc maps and unmaps each one,
    so every request faults in fresh zeroed pages (measured: ~460,000 minor faults and twice
    the broker CPU per GB produced). Raising the mmap and trim thresholds keeps them in the
    heap, where freed buffers are reused."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.mallopt(m_trim_threshold, 256 << 20)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune


def _use_uvloop() -> bool:
    """uvloop when installed (measured: less broker CPU per GB produced, lower latency, the same
    zero-copy fetch); STROM_EVENT_LOOP=asyncio selects the standard loop."""
    return os.environ.get("STROM_EVENT_LOOP", "uvloop") != "asyncio"


async def _serve(cfg: broker_config.BrokerConfig, started: float) -> int:
    if cfg.process_roles:  # KRaft: a controller, a broker, or both (seed 001's KafkaRaftServer)
        from strom.server.kraft.node import KafkaRaftServer

        broker = KafkaRaftServer(cfg)
        role = "+".join(cfg.process_roles)
    else:
        from strom.server.broker import Broker

        broker = Broker(cfg)
        role = "broker"
    _started()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await broker.startup()
    except (OSError, ValueError) as e:
        click.echo(f"strom: cannot start: {e}", err=True)
        await broker.shutdown()
        return 1
    listeners = ", ".join(str(listener) for listener in broker.advertised)
    elapsed = (time.monotonic() - started) * 1000
    metrics = ""
    if broker.metrics_server is not None:
        metrics = "; metrics on http://{}:{}/metrics".format(*broker.metrics_server.address)
    click.echo(f"strom: {role} {broker.broker_id} ready on {listeners} "
               f"(cluster {broker.cluster_id}, started in {elapsed:.0f} ms){metrics}")
    sys.stdout.flush()
    await stop.wait()
    logging.getLogger("strom").info("shutting down")
    await broker.shutdown()
    return 0
