"""The open-file cache: at most `capacity` descriptors, pinned ones never closed under their
user, and none leaked when many threads open, use and close files at once."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from strom.log.open_files import OpenFiles


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def files(tmp_path: Path, count: int) -> list[Path]:
    out = []
    for i in range(count):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"%d" % i)
        out.append(path)
    return out


def test_least_recently_used_are_closed_and_reopened(tmp_path):
    cache = OpenFiles(capacity=2)
    a, b, c = files(tmp_path, 3)
    for path in (a, b, a, c):  # c evicts b: a was used after it
        with cache.use(path, lambda p=path: os.open(p, os.O_RDONLY)) as fd:
            assert os.pread(fd, 8, 0) == path.read_bytes()
    assert len(cache) == 2 and set(cache._fds) == {a, c}
    for path in (a, b, c):
        cache.close(path)
    assert len(cache) == 0


def test_a_pinned_descriptor_outlives_eviction_and_close(tmp_path):
    cache = OpenFiles(capacity=1)
    a, b = files(tmp_path, 2)
    pin = cache.pin(a, lambda: os.open(a, os.O_RDONLY))
    with cache.use(b, lambda: os.open(b, os.O_RDONLY)):
        pass  # over capacity: b is not pinned any more, a is
    assert os.pread(pin.fd, 8, 0) == b"0"
    cache.close(a)
    assert os.pread(pin.fd, 8, 0) == b"0", "closed while pinned: the descriptor waits for the pin"
    pin.release()
    try:
        os.fstat(pin.fd)
        still_open = True
    except OSError:
        still_open = False
    assert not still_open
    cache.close(b)


def test_many_threads_read_the_right_file_and_leak_no_descriptor(tmp_path):
    cache = OpenFiles(capacity=8)
    paths = files(tmp_path, 40)
    before = open_fds()
    wrong: list[tuple[Path, bytes]] = []

    def work(seed: int) -> None:
        for i in range(400):
            path = paths[(seed * 7 + i * 13) % len(paths)]
            with cache.use(path, lambda p=path: os.open(p, os.O_RDONLY)) as fd:
                got = os.pread(fd, 8, 0)
                if got != path.read_bytes():
                    wrong.append((path, got))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong[:3]
    assert len(cache) <= 8
    for path in paths:
        cache.close(path)
    assert len(cache) == 0 and open_fds() == before
