"""A FUSE filesystem that forgets what was never fsynced: the power-loss harness.

Run as a program, `python powerfs.py BACKING MOUNTPOINT` loads the tree under BACKING, serves
it at MOUNTPOINT and keeps two states of every file and directory:

- live: what processes see, like the page cache (every write, create, rename and unlink lands
  here at once);
- durable: what a disk would hold after a power cut. Linux's promises, taken at their word:
  fsync (or fdatasync) of a file makes that file's data and size durable; fsync of a directory
  makes that directory's entries (names created, renamed in or out, unlinked) durable. Nothing
  else does: a new file whose directory was never fsynced is gone after the cut, whatever was
  fsynced into it; a rename reverts until the directory holding the new name (and, for the
  old name, its directory) is fsynced.

Commands, one a line on standard input, each answered with one line on standard output:

- `cut strict`: the power goes off. Every later operation fails with EIO; the unmount that
  follows writes the durable state (and nothing else) back to BACKING.
- `cut torn SEED`: the same, but as if the kernel's write-back had been part way through:
  each changed file is left as it was at its last fsync, or with its live content up to a
  random byte past its first change (so a record batch may be torn anywhere) followed by the
  durable bytes beyond that, which a truncation since the last fsync has removed; each
  directory keeps all or none of its unsynced entry changes. SEED makes it repeatable. Never
  does new data come back without the older data before it, nor cut-off data reappear after
  newer data: what a journaling filesystem's ordered write-back can leave.
- `delay SECONDS`: every fsync first waits this long (a slow disk) and counts only if the power
  is still on when it finishes.
- `syncing`: how many fsyncs are waiting out that delay right now;
- `unsynced`: a JSON list of live paths whose data or entries differ from their durable state.

Without a cut, unmounting writes the live state back (a clean unmount syncs everything). The
line `ready` is printed once the mount answers. When standard input closes, the filesystem
unmounts itself, so a dead test leaves no mount behind.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# mfusepy picks libfuse 2 when both are installed; this harness is written for libfuse 3.
os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
import mfusepy  # noqa: E402

ROOT = 1


@dataclass(eq=False)
class Node:
    """One inode: a file (`data`) or a directory (`entries`: name -> inode number)."""

    ino: int
    mode: int
    data: bytearray | None = None
    entries: dict[str, int] | None = None
    nlink: int = 1
    opened: int = 0
    shrunk_to: int | None = None  # the smallest size a truncation left since the last fsync
    mtime_ns: int = field(default_factory=time.time_ns)

    @property
    def is_dir(self) -> bool:
        return self.entries is not None


def _fail(code: int) -> mfusepy.FuseOSError:
    return mfusepy.FuseOSError(code)


def _powered(method: Callable) -> Callable:
    """Run an operation under the filesystem's lock, or fail it with EIO once the power is off."""

    @functools.wraps(method)
    def run(self: PowerLossFS, *args: Any) -> Any:
        with self.lock:
            if not self.powered:
                raise _fail(errno.EIO)
            return method(self, *args)

    return run


def torn(old: bytes, new: bytes, shrunk_to: int | None, rng: random.Random) -> bytes:
    """What a crash part way through write-back may leave of a file that was `old` at its last
    fsync and is `new` now; `shrunk_to` is the smallest size a truncation gave it since."""
    if old == new or rng.random() < 0.2:
        return old  # nothing of it reached the disk
    common = len(os.path.commonprefix([old, new]))
    if shrunk_to is not None:
        # The truncation reached the disk, then part of what was written after it.
        return new[:rng.randint(min(shrunk_to, common), len(new))]
    cut = rng.randint(common, len(new))
    return new[:cut] + old[cut:]


class PowerLossFS(mfusepy.Operations):
    use_ns = True

    def __init__(self, backing: Path) -> None:
        self.backing = backing
        self.lock = threading.Lock()
        self.nodes: dict[int, Node] = {}
        self.durable_data: dict[int, bytes] = {}
        self.durable_entries: dict[int, dict[str, int]] = {}
        self.handles: dict[int, tuple[int, int]] = {}  # fh -> (inode, open flags)
        self._next_ino = ROOT
        self._next_fh = 1
        self.powered = True
        self.cut: tuple[str, int] | None = None
        self.fsync_delay = 0.0
        self.syncing = 0
        self.power_off = threading.Event()
        self._import(backing)

    # -- the two states

    def _new_node(self, mode: int, directory: bool) -> Node:
        node = Node(self._next_ino, mode, entries={} if directory else None,
                    data=None if directory else bytearray())
        self.nodes[node.ino] = node
        self._next_ino += 1
        return node

    def _import(self, backing: Path) -> None:
        """Everything under BACKING is on disk: live and durable start out equal."""

        def load(path: Path) -> Node:
            st = path.lstat()
            node = self._new_node(st.st_mode, stat.S_ISDIR(st.st_mode))
            node.mtime_ns = st.st_mtime_ns
            if node.is_dir:
                for child in sorted(path.iterdir()):
                    if child.is_dir() or child.is_file():
                        node.entries[child.name] = load(child).ino
                self.durable_entries[node.ino] = dict(node.entries)
            else:
                node.data = bytearray(path.read_bytes())
                self.durable_data[node.ino] = bytes(node.data)
            return node

        load(backing)

    def export(self) -> None:
        """Replace BACKING's contents with the live state, or after a cut with what survived."""
        mode, seed = self.cut or ("live", 0)
        rng = random.Random(seed)
        for child in self.backing.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        written: set[int] = set()

        def entries_of(node: Node) -> dict[str, int]:
            durable = self.durable_entries.get(node.ino, {})
            if mode == "live":
                return node.entries
            if mode == "torn" and durable != node.entries and rng.random() < 0.5:
                return node.entries
            return durable

        def data_of(node: Node) -> bytes:
            durable = self.durable_data.get(node.ino, b"")
            if mode == "live":
                return bytes(node.data)
            if mode == "torn":
                return torn(durable, bytes(node.data), node.shrunk_to, rng)
            return durable

        def write(node: Node, path: Path) -> None:
            written.add(node.ino)
            for name, ino in sorted(entries_of(node).items()):
                child, target = self.nodes[ino], path / name
                if child.is_dir:
                    if ino in written:
                        continue  # a directory moved under itself across two fsyncs: once is enough
                    target.mkdir()
                    write(child, target)
                else:
                    target.write_bytes(data_of(child))
                os.chmod(target, stat.S_IMODE(child.mode))
                os.utime(target, ns=(child.mtime_ns, child.mtime_ns))

        write(self.nodes[ROOT], self.backing)

    def unsynced(self) -> list[str]:
        """Live paths whose data or entries are not yet durable."""
        out: list[str] = []

        def walk(node: Node, path: str) -> None:
            if node.is_dir:
                if self.durable_entries.get(node.ino) != node.entries:
                    out.append(path or "/")
                for name, ino in sorted(node.entries.items()):
                    walk(self.nodes[ino], f"{path}/{name}")
            elif self.durable_data.get(node.ino) != node.data:
                out.append(path)

        with self.lock:
            walk(self.nodes[ROOT], "")
        return out

    # -- paths and handles

    def _lookup(self, path: str) -> Node:
        node = self.nodes[ROOT]
        for name in filter(None, path.split("/")):
            if not node.is_dir:
                raise _fail(errno.ENOTDIR)
            ino = node.entries.get(name)
            if ino is None:
                raise _fail(errno.ENOENT)
            node = self.nodes[ino]
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._lookup(head)
        if not parent.is_dir:
            raise _fail(errno.ENOTDIR)
        return parent, name

    def _node(self, path: str | None, fh: int | None) -> Node:
        if fh is not None and fh in self.handles:
            return self.nodes[self.handles[fh][0]]
        if path is None:
            raise _fail(errno.EBADF)
        return self._lookup(path)

    def _open_handle(self, node: Node, flags: int) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = (node.ino, flags)
        node.opened += 1
        return fh

    def _link_count_dropped(self, node: Node) -> None:
        node.nlink -= 1
        if node.nlink <= 0 and node.opened == 0 and not node.is_dir:
            node.data = bytearray()  # unreachable live; its durable copy stays for the cut

    @staticmethod
    def _resize(node: Node, size: int) -> None:
        if size < len(node.data):
            del node.data[size:]
            node.shrunk_to = size if node.shrunk_to is None else min(node.shrunk_to, size)
        else:
            node.data.extend(bytes(size - len(node.data)))
        node.mtime_ns = time.time_ns()

    # -- FUSE operations: metadata

    def init(self, path: str) -> None:
        print("ready", flush=True)

    @_powered
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        node = self._node(path, fh)
        if node.is_dir:
            size = 4096
            nlink = 2 + sum(self.nodes[i].is_dir for i in node.entries.values())
        else:
            size, nlink = len(node.data), max(node.nlink, 0)
        return {"st_mode": node.mode, "st_ino": node.ino, "st_nlink": nlink, "st_size": size,
                "st_uid": os.getuid(), "st_gid": os.getgid(), "st_blocks": (size + 511) // 512,
                "st_atime": node.mtime_ns, "st_mtime": node.mtime_ns, "st_ctime": node.mtime_ns}

    def statfs(self, path: str) -> dict[str, int]:
        free = 1 << 24
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": free, "f_bfree": free,
                "f_bavail": free, "f_files": 1 << 20, "f_ffree": 1 << 20, "f_namemax": 255}

    def access(self, path: str, amode: int) -> int:
        return 0

    @_powered
    def chmod(self, path: str | None, mode: int) -> int:
        node = self._lookup(path)
        node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(mode)
        return 0

    def chown(self, path: str | None, uid: int, gid: int) -> int:
        return 0

    @_powered
    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        self._lookup(path).mtime_ns = times[1] if times else time.time_ns()
        return 0

    # -- namespace

    @_powered
    def mkdir(self, path: str, mode: int) -> int:
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _fail(errno.EEXIST)
        parent.entries[name] = self._new_node(stat.S_IFDIR | stat.S_IMODE(mode), True).ino
        parent.mtime_ns = time.time_ns()
        return 0

    @_powered
    def rmdir(self, path: str) -> int:
        parent, name = self._parent(path)
        node = self._lookup(path)
        if not node.is_dir:
            raise _fail(errno.ENOTDIR)
        if node.entries:
            raise _fail(errno.ENOTEMPTY)
        del parent.entries[name]
        node.nlink = 0
        parent.mtime_ns = time.time_ns()
        return 0

    @_powered
    def unlink(self, path: str) -> int:
        parent, name = self._parent(path)
        node = self._lookup(path)
        if node.is_dir:
            raise _fail(errno.EISDIR)
        del parent.entries[name]
        parent.mtime_ns = time.time_ns()
        self._link_count_dropped(node)
        return 0

    @_powered
    def rename(self, old: str, new: str) -> int:
        source_dir, source_name = self._parent(old)
        node = self._lookup(old)
        target_dir, target_name = self._parent(new)
        replaced = target_dir.entries.get(target_name)
        if replaced == node.ino:
            return 0
        if replaced is not None:
            victim = self.nodes[replaced]
            if victim.is_dir and not node.is_dir:
                raise _fail(errno.EISDIR)
            if node.is_dir and not victim.is_dir:
                raise _fail(errno.ENOTDIR)
            if victim.is_dir and victim.entries:
                raise _fail(errno.ENOTEMPTY)
            self._link_count_dropped(victim)
        del source_dir.entries[source_name]
        target_dir.entries[target_name] = node.ino
        source_dir.mtime_ns = target_dir.mtime_ns = time.time_ns()
        return 0

    # -- file data

    @_powered
    def create(self, path: str, mode: int, flags: int = 0) -> int:
        parent, name = self._parent(path)
        existing = parent.entries.get(name)
        if existing is not None:
            if flags & os.O_EXCL:
                raise _fail(errno.EEXIST)
            node = self.nodes[existing]
            if flags & os.O_TRUNC:
                self._resize(node, 0)
        else:
            node = self._new_node(stat.S_IFREG | stat.S_IMODE(mode), False)
            parent.entries[name] = node.ino
            parent.mtime_ns = time.time_ns()
        return self._open_handle(node, flags)

    @_powered
    def open(self, path: str, flags: int) -> int:
        node = self._lookup(path)
        if node.is_dir:
            raise _fail(errno.EISDIR)
        if flags & os.O_TRUNC:
            self._resize(node, 0)
        return self._open_handle(node, flags)

    @_powered
    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        return bytes(self._node(path, fh).data[offset:offset + size])

    @_powered
    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        node = self._node(path, fh)
        if self.handles.get(fh, (0, 0))[1] & os.O_APPEND:
            offset = len(node.data)
        if offset > len(node.data):
            self._resize(node, offset)
        node.data[offset:offset + len(data)] = data
        node.mtime_ns = time.time_ns()
        return len(data)

    @_powered
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        node = self._node(path, fh)
        if node.is_dir:
            raise _fail(errno.EISDIR)
        self._resize(node, length)
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0  # close() is no sync point

    def release(self, path: str | None, fh: int) -> int:
        with self.lock:
            ino, _ = self.handles.pop(fh, (None, 0))
            if ino is not None:
                node = self.nodes[ino]
                node.opened -= 1
                if node.nlink <= 0 and node.opened == 0:
                    node.data = bytearray()
        return 0

    # -- directories

    @_powered
    def opendir(self, path: str) -> int:
        node = self._lookup(path)
        if not node.is_dir:
            raise _fail(errno.ENOTDIR)
        return node.ino  # a directory handle is its inode number

    @_powered
    def readdir(self, path: str | None, fh: int) -> list[str]:
        node = self.nodes[fh] if fh in self.nodes else self._lookup(path)
        return [".", "..", *node.entries]

    def releasedir(self, path: str | None, fh: int) -> int:
        return 0

    # -- the sync points

    def _sync(self, make_durable: Callable[[], None]) -> int:
        if self.fsync_delay:
            with self.lock:
                self.syncing += 1
            self.power_off.wait(self.fsync_delay)  # a slow disk: durable only once this returns
            with self.lock:
                self.syncing -= 1
        with self.lock:
            if not self.powered:
                raise _fail(errno.EIO)
            make_durable()
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        def make_durable() -> None:
            node = self._node(path, fh)
            self.durable_data[node.ino] = bytes(node.data)
            node.shrunk_to = None

        return self._sync(make_durable)

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        def make_durable() -> None:
            node = self.nodes[fh] if fh in self.nodes else self._lookup(path)
            self.durable_entries[node.ino] = dict(node.entries)

        return self._sync(make_durable)

    # -- control

    def command(self, line: str) -> str:
        words = line.split()
        if words[:1] == ["cut"] and len(words) in (2, 3) and words[1] in ("strict", "torn"):
            with self.lock:
                self.powered = False
                self.cut = (words[1], int(words[2]) if len(words) == 3 else 0)
            self.power_off.set()
            return "ok"
        if words[:1] == ["delay"] and len(words) == 2:
            self.fsync_delay = float(words[1])
            return "ok"
        if words == ["syncing"]:
            return str(self.syncing)
        if words == ["unsynced"]:
            return json.dumps(self.unsynced())
        return f"error: unknown command {line.strip()!r}"


class _Fuse(mfusepy.FUSE):
    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        # mfusepy drops the file handle of an ftruncate; hand it over so an open file whose
        # name is gone can still be truncated.
        fh = fip.contents.fh if fip else None
        name = None if path is None else path.decode(self.encoding, self.errors)
        return self.operations.truncate(name, length, fh)


def unmount(mountpoint: Path, lazy: bool = False) -> bool:
    """Unmount a FUSE mount; True once it is no longer mounted."""
    args = ["fusermount3", "-u", *(["-z"] if lazy else []), str(mountpoint)]
    if shutil.which("fusermount3") is None:
        args = ["umount", *(["-l"] if lazy else []), str(mountpoint)]
    subprocess.run(args, capture_output=True, check=False)
    return not os.path.ismount(mountpoint)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} BACKING MOUNTPOINT", file=sys.stderr)
        return 2
    backing, mountpoint = Path(argv[1]).resolve(), Path(argv[2]).resolve()
    fs = PowerLossFS(backing)

    def control() -> None:
        for line in sys.stdin:
            if line.strip():
                print(fs.command(line), flush=True)
        unmount(mountpoint, lazy=True)  # the test went away: leave no mount behind

    threading.Thread(target=control, daemon=True).start()
    # hard_remove: an unlinked file that is still open is really unlinked, not renamed to a
    # .fuse_hidden file that a directory fsync would make durable.
    _Fuse(fs, str(mountpoint), foreground=True, hard_remove=True, fsname="strom-powerloss")
    with fs.lock:
        fs.powered = False  # any straggler after the unmount changes nothing
    fs.export()
    print("exported", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
