"""A standalone ZooKeeper for Strom clusters: Debian's ZooKeeper run as a plain Java process.

For tests, benchmarks and `strom cluster up`: one server on 127.0.0.1 with its data, config
and log in one directory. Needs Java and Debian's `zookeeper` package (`scripts/bootstrap
cluster` installs both).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

JAVA_DIR = Path("/usr/share/java")
# zookeeper.jar names its dependencies in its manifest; the two logging jars route ZooKeeper's
# SLF4J logging to log4j, and so to a file, instead of dropping it with a warning on stderr.
ZOOKEEPER_JAR = JAVA_DIR / "zookeeper.jar"
LOGGING_JARS = (JAVA_DIR / "slf4j-log4j12.jar", JAVA_DIR / "log4j-1.2.jar")
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
# A small starting heap and the client compiler only: a test ZooKeeper must start fast. The
# heap may grow to 1 GB: 100,000 partitions' nodes and a controller's writes queued for the
# transaction log ran 256 MB out of memory.
JVM_OPTIONS = ["-Xms32m", "-Xmx1g", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Djava.net.preferIPv4Stack=true", "-Dzookeeper.jmx.log4j.disable=true"]

_LOG4J = """\
log4j.rootLogger=INFO, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File={log}
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} %-5p [%t] %c{{1}}: %m%n
"""


def zookeeper_available() -> str | None:
    """None if ZooKeeper can run here, else what is missing and how to get it."""
    missing = []
    if shutil.which("java") is None:
        missing.append("java")
    if not ZOOKEEPER_JAR.is_file():
        missing.append(f"ZooKeeper ({ZOOKEEPER_JAR})")
    if not missing:
        return None
    return f"{' and '.join(missing)} not found: run scripts/bootstrap cluster"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def four_letter_word(port: int, word: str, timeout: float = 1.0) -> str:
    """ZooKeeper's admin commands over the client port ("srvr", "ruok", "stat")."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(word.encode())
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer:
    def __init__(self, data_dir: Path | None = None, port: int = 0, *, fsync: bool = True) -> None:
        """`fsync=False` skips syncing ZooKeeper's transaction log: for throwaway test data on
        a busy machine, where every sync can cost tens of milliseconds."""
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="strom-zookeeper-")
            data_dir = Path(self._tmp.name)
        self.data_dir = Path(data_dir)
        self.port = port
        self._fixed_port = port != 0
        self.fsync = fsync
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    def start(self, timeout: float = 30.0) -> ZooKeeperServer:
        """Start and return once it serves requests. A port picked here (port 0) that another
        process takes first is replaced by a fresh one; a restart keeps the port it had."""
        problem = zookeeper_available()
        if problem:
            raise RuntimeError(problem)
        if self.proc is not None and self.proc.poll() is None:
            return self
        begin = time.monotonic()
        deadline = begin + timeout
        for attempt in range(5):
            if not self.port:
                self.port = _free_port()
            if self._launch(deadline):
                self.startup_seconds = time.monotonic() - begin
                return self
            if self._fixed_port or attempt == 4 or time.monotonic() >= deadline \
                    or "Address already in use" not in self.log_text():
                break
            self.port = 0  # lost the port between picking and binding: pick another
        raise RuntimeError(f"ZooKeeper did not start on port {self.port}; its log "
                           f"({self.log_path}):\n" + "\n".join(self.log_text().splitlines()[-20:]))

    def _launch(self, deadline: float) -> bool:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        # tickTime 500 ms: sessions may time out in 1 s (ZooKeeper's floor is 2 ticks), so
        # tests of broker failure need not wait long.
        config.write_text("\n".join([
            "tickTime=500",
            "minSessionTimeout=1000",
            "maxSessionTimeout=60000",
            f"dataDir={self.data_dir / 'data'}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat",
            f"forceSync={'yes' if self.fsync else 'no'}",
            "",
        ]))
        log4j = self.data_dir / "log4j.properties"
        log4j.write_text(_LOG4J.format(log=self.log_path))
        if self.log_path.exists():
            self.log_path.unlink()  # this run's log only: start() reads it for errors
        classpath = [str(ZOOKEEPER_JAR)] + [str(j) for j in LOGGING_JARS if j.is_file()]
        args = ["java", *JVM_OPTIONS, f"-Dlog4j.configuration=file:{log4j}",
                "-cp", ":".join(classpath), MAIN_CLASS, str(config)]
        with open(self.data_dir / "zookeeper.out", "ab") as out:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if self.serving():
                return True
            time.sleep(0.05)
        self.kill()
        return False

    def serving(self) -> bool:
        """True when it answers as a running server (`srvr` reports its version)."""
        try:
            return four_letter_word(self.port, "srvr").startswith("Zookeeper version")
        except OSError:
            return False

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait (SIGKILL after `timeout`). Safe to call again."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        running = self.proc is not None and self.proc.poll() is None
        return f"ZooKeeperServer({self.connect}, {'running' if running else 'stopped'}, {os.fspath(self.data_dir)})"
