"""`strom serve` processes forked from a server that has imported Strom already, for test suites.

A broker process spends about 0.2 s of CPU importing Strom before it does anything (most of it
generating the protocol codecs from their schemas) and a test suite starts hundreds of them.
Forked from a process that holds those imports, a broker is ready after about 0.04 s of CPU.
The child runs the same entry point as `python -m strom`, with the environment, stdout and
stderr pipes it is given; it is still a separate process reached over real sockets, and killed,
paused and waited for as one. multiprocessing's fork server does the forking: that server was
started from a fresh interpreter, so no thread of the test process is forked with it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pkgutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import strom

# What a broker, a KRaft node or a controller imports: the server-side packages whole.
_PRELOADED = ("cli.main", "server", "raft", "controller", "coordinator", "metadata", "log",
              "network", "security", "metrics", "config", "protocol", "client")

_context = None
_EXECUTABLE = sys.executable  # the interpreter the fork server runs


def _fork_server():
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_modules_to_preload())
        _context = context
    return _context


def _modules_to_preload() -> list[str]:
    from strom.protocol.messages import CODEC_MODULES  # imported lazily by a broker: here at once

    root = Path(strom.__file__).parent
    names = [__name__, *CODEC_MODULES]
    for part in _PRELOADED:
        name = f"strom.{part}"
        names.append(name)
        path = root.joinpath(*part.split("."))
        if path.is_dir():
            names += [m.name for m in pkgutil.walk_packages([str(path)], prefix=name + ".")]
    return names


def can_fork(env: dict[str, str] | None) -> bool:
    """Whether a broker with these extra environment variables can be forked: not when they
    change what the interpreter reads only at its start, nor when a test has swapped
    `sys.executable` for another interpreter (or a wrapper that sets limits first)."""
    return sys.executable == _EXECUTABLE and not any(key.startswith("PYTHON") for key in env or {})


class ForkedProcess:
    """The part of `subprocess.Popen`'s interface that tests use on a broker process."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        context = _fork_server()
        out_r, out_w = context.Pipe(duplex=False)
        err_r, err_w = context.Pipe(duplex=False)
        self.args = args
        self._process = context.Process(target=_run, args=(args, env, os.getcwd(), out_w, err_w),
                                        daemon=True, name="strom")
        self._process.start()
        out_w.close()
        err_w.close()
        self.pid: int = self._process.pid
        self.stdout: IO[str] = _reader(out_r)
        self.stderr: IO[str] = _reader(err_r)

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):  # it has just exited
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _reader(connection) -> IO[str]:
    stream = open(os.dup(connection.fileno()), encoding="utf-8", errors="replace")  # noqa: SIM115
    connection.close()
    return stream


def _run(args: list[str], env: dict[str, str], cwd: str, out, err) -> None:
    """In the forked child: become `python -m strom ARGS`."""
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    out.close()
    err.close()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["strom", *args]
    from strom.cli.main import main

    main(args, prog_name="strom")
