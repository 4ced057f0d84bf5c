"""CrashFS: a FUSE filesystem that remembers only what was fsynced, so a test can cut the power.

Everything the mounted tree shows lives in a "live" copy (the page cache and the disk as a
running machine sees them). What a power cut would keep is tracked apart, as Linux promises
it and no more:

- a file's data and size become durable when the file is fsynced (fsync or fdatasync, through
  any descriptor of the inode); data written since is not;
- a directory's entries (creations, renames, unlinks, of files and subdirectories) become
  durable when that directory is fsynced; a rename between two directories is durable on each
  side once that side's directory is fsynced;
- an inode whose name never became durable is gone after a cut, whatever was fsynced in it.

The durable state is kept on the host: `<state>/durable/<inode>` holds each file's synced bytes
and `<state>/durable.json` the synced directory entries and inode modes. Mounting rebuilds the
live tree from the durable state, so "cut the power" is: stop the processes using the mount,
stop this daemon without saving anything, mount again.

Run as a program (`crashfs.py STATE_DIR MOUNTPOINT`), it mounts, prints `mounted`, and takes
commands on stdin, one per line, answering each with one line:

- `delay SECONDS`: every fsync from now on waits this long before it takes effect (a slow
  disk, so a test can cut the power while an fsync is still in flight);
- `cut`: the power goes: unmount and exit, keeping only the durable state;
- `cut torn SEED`: as `cut`, but first, as the kernel's write-back might have, write a random
  prefix of each file's unsynced bytes (cut at any byte, so batches tear) to the durable copy.

End of input is a plain `cut`, so a daemon whose test died unmounts itself.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyfuse3
import trio

ROOT = pyfuse3.ROOT_INODE
_CACHE_SECONDS = 10.0  # every change goes through this mount, so the kernel's caches stay true
_COPY_CHUNK = 1 << 20


@dataclass
class Node:
    ino: int
    mode: int
    uid: int = 0
    gid: int = 0
    mtime_ns: int = field(default_factory=time.time_ns)
    links: int = 1  # names in live directories
    lookups: int = 0  # references the kernel holds (lookup count)
    opens: int = 0  # open file handles
    entries: dict[bytes, int] | None = None  # directories only
    parent: int = ROOT  # directories only
    fd: int | None = None  # the live file's descriptor while open
    dirty: tuple[int, int] | None = None  # [lo, hi): live bytes that differ from the durable copy

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    def meta(self) -> list[int]:
        return [self.mode, self.uid, self.gid, self.mtime_ns]


def _fs_error(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


class CrashFS(pyfuse3.Operations):
    """The filesystem; see the module docstring for what it keeps across a cut."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__()
        self.state = Path(state_dir)
        self.live = self.state / "live"
        self.durable = self.state / "durable"
        self.manifest = self.state / "durable.json"
        self.fsync_delay = 0.0
        self.powered_off = False
        self._in_flight: set[trio.CancelScope] = set()
        self.nodes: dict[int, Node] = {}
        self.handles: dict[int, int] = {}  # file handle -> inode
        self.dir_handles: dict[int, tuple[int, list[tuple[bytes, int]]]] = {}
        self._next_fh = 1
        self._load()

    # -- the durable state

    def _load(self) -> None:
        """Rebuild the live tree from what is durable, and forget everything else."""
        self.durable.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.live, ignore_errors=True)
        self.live.mkdir()
        if self.manifest.exists():
            saved = json.loads(self.manifest.read_text())
        else:
            saved = {"next_ino": ROOT + 1, "dirs": {},
                     "meta": {str(ROOT): [stat.S_IFDIR | 0o755, os.getuid(), os.getgid(), time.time_ns()]}}
        self.next_ino: int = saved["next_ino"]
        meta = {int(k): v for k, v in saved["meta"].items()}
        dirs = {int(k): {os.fsencode(n): i for n, i in v.items()} for k, v in saved["dirs"].items()}
        self.durable_meta: dict[int, list[int]] = {}
        self.durable_dirs: dict[int, dict[bytes, int]] = {}
        pending, seen = [(ROOT, ROOT)], {ROOT}
        while pending:
            ino, parent = pending.pop()
            mode, uid, gid, mtime_ns = meta[ino]
            node = Node(ino, mode, uid, gid, mtime_ns, links=0, parent=parent)
            self.nodes[ino] = node
            self.durable_meta[ino] = node.meta()
            if not node.is_dir:
                source = self.durable / str(ino)
                if source.exists():
                    shutil.copyfile(source, self.live / str(ino))
                else:
                    (self.live / str(ino)).touch()
                continue
            node.entries = {}
            for name, child in dirs.get(ino, {}).items():
                if child not in meta:
                    continue
                if child in seen:
                    if stat.S_ISDIR(meta[child][0]):
                        continue  # a directory has one name: a stale second one is dropped
                else:
                    seen.add(child)
                    pending.append((child, ino))
                node.entries[name] = child
            self.durable_dirs[ino] = dict(node.entries)
        for d in list(self.nodes.values()):
            for child in d.entries.values() if d.is_dir else ():
                self.nodes[child].links += 1
        for path in self.durable.iterdir():
            if not path.name.isdigit() or int(path.name) not in self.nodes:
                path.unlink()  # fsynced once, but no durable name reaches it: lost
        self._save_manifest()

    def _save_manifest(self) -> None:
        saved = {
            "next_ino": self.next_ino,
            "dirs": {str(d): {os.fsdecode(n): i for n, i in e.items()} for d, e in self.durable_dirs.items()},
            "meta": {str(i): m for i, m in self.durable_meta.items()},
        }
        tmp = self.manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps(saved))
        os.replace(tmp, self.manifest)

    def _sync_file(self, node: Node) -> None:
        """Make the live bytes and size of `node` its durable ones."""
        self.durable_meta[node.ino] = node.meta()
        target = self.durable / str(node.ino)
        if node.dirty is None and target.exists():
            return
        lo, hi = node.dirty if node.dirty is not None else (0, 1 << 62)
        self._copy_range(node, lo, hi)
        node.dirty = None

    def _copy_range(self, node: Node, lo: int, hi: int, size: int | None = None) -> None:
        """Copy live bytes [lo, hi) to the durable copy, whose size becomes `size` (default:
        the live size)."""
        src = os.open(self.live / str(node.ino), os.O_RDONLY)
        dst = os.open(self.durable / str(node.ino), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            live_size = os.fstat(src).st_size
            os.ftruncate(dst, live_size if size is None else size)
            pos, end = lo, min(hi, live_size if size is None else size)
            while pos < end:
                chunk = os.pread(src, min(_COPY_CHUNK, end - pos), pos)
                if not chunk:
                    break
                os.pwrite(dst, chunk, pos)
                pos += len(chunk)
        finally:
            os.close(src)
            os.close(dst)

    def _sync_dir(self, node: Node) -> None:
        self.durable_meta[node.ino] = node.meta()
        self.durable_dirs[node.ino] = dict(node.entries)
        for child in node.entries.values():
            self.durable_meta.setdefault(child, self.nodes[child].meta())
        self._save_manifest()

    def tear(self, seed: int) -> None:
        """Write a random prefix of each file's unsynced bytes to its durable copy, as the
        kernel's write-back may have done before the power went."""
        rng = random.Random(seed)
        for node in sorted(self.nodes.values(), key=lambda n: n.ino):
            if node.is_dir or node.dirty is None:
                continue
            live_size = os.stat(self.live / str(node.ino)).st_size
            target = self.durable / str(node.ino)
            durable_size = target.stat().st_size if target.exists() else 0
            lo, hi = node.dirty
            hi = min(hi, live_size)
            if live_size < durable_size or hi <= lo:
                continue  # a shrunken file: its write-back is not modelled, it reverts
            cut = rng.randint(lo, hi)
            self._copy_range(node, lo, cut, size=max(durable_size, cut))

    # -- helpers

    def _node(self, ino: int) -> Node:
        node = self.nodes.get(ino)
        if node is None:
            raise _fs_error(errno.ENOENT)
        return node

    def _dir(self, ino: int) -> Node:
        node = self._node(ino)
        if not node.is_dir:
            raise _fs_error(errno.ENOTDIR)
        return node

    def _attr(self, node: Node) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = node.ino
        attr.generation = 0
        attr.entry_timeout = attr.attr_timeout = _CACHE_SECONDS
        attr.st_mode = node.mode
        attr.st_uid, attr.st_gid = node.uid, node.gid
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = node.mtime_ns
        attr.st_blksize = 4096
        if node.is_dir:
            attr.st_nlink = 2 + sum(self.nodes[c].is_dir for c in node.entries.values())
            attr.st_size, attr.st_blocks = 4096, 8
        else:
            st = os.stat(self.live / str(node.ino))
            attr.st_nlink = node.links
            attr.st_size, attr.st_blocks = st.st_size, st.st_blocks
        return attr

    def _entry(self, node: Node) -> pyfuse3.EntryAttributes:
        node.lookups += 1
        return self._attr(node)

    def _new_node(self, parent: Node, name: bytes, mode: int, ctx: pyfuse3.RequestContext) -> Node:
        if name in parent.entries:
            raise _fs_error(errno.EEXIST)
        node = Node(self.next_ino, mode, ctx.uid, ctx.gid, parent=parent.ino)
        self.next_ino += 1
        if node.is_dir:
            node.entries = {}
        else:
            (self.live / str(node.ino)).touch()
            node.dirty = (0, 0)  # never synced: not even its empty durable copy exists
        self.nodes[node.ino] = node
        parent.entries[name] = node.ino
        parent.mtime_ns = time.time_ns()
        return node

    def _maybe_free(self, node: Node) -> None:
        """Drop a live inode nobody can reach any more (its durable copy stays: a durable
        directory entry may still name it)."""
        if node.links > 0 or node.lookups > 0 or node.opens > 0 or node.ino == ROOT:
            return
        del self.nodes[node.ino]
        if not node.is_dir:
            (self.live / str(node.ino)).unlink(missing_ok=True)

    def _mark_dirty(self, node: Node, lo: int, hi: int) -> None:
        if node.dirty is not None:
            lo, hi = min(lo, node.dirty[0]), max(hi, node.dirty[1])
        node.dirty = (lo, hi)
        node.mtime_ns = time.time_ns()

    def _open_fd(self, node: Node) -> int:
        if node.fd is None:
            node.fd = os.open(self.live / str(node.ino), os.O_RDWR)
        return node.fd

    def _new_handle(self, node: Node) -> pyfuse3.FileInfo:
        self._open_fd(node)
        node.opens += 1
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = node.ino
        return pyfuse3.FileInfo(fh=fh)

    async def _slow_disk(self) -> None:
        """Wait out the disk's delay; an fsync the power cut interrupts fails and keeps nothing."""
        if self.fsync_delay > 0:
            with trio.CancelScope() as scope:
                self._in_flight.add(scope)
                try:
                    await trio.sleep(self.fsync_delay)
                finally:
                    self._in_flight.discard(scope)
        if self.powered_off:
            raise _fs_error(errno.EIO)

    def power_off(self) -> None:
        """From now on nothing becomes durable; fsyncs still waiting are cut short."""
        self.powered_off = True
        for scope in list(self._in_flight):
            scope.cancel()

    # -- namespace

    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        parent = self._dir(parent_inode)
        if name == b".":
            return self._entry(parent)
        if name == b"..":
            return self._entry(self._node(parent.parent))
        ino = parent.entries.get(name)
        if ino is None:
            raise _fs_error(errno.ENOENT)
        return self._entry(self.nodes[ino])

    def forget(self, inode_list: list[tuple[int, int]]) -> None:  # type: ignore[override]
        for ino, count in inode_list:
            node = self.nodes.get(ino)
            if node is not None:
                node.lookups = max(0, node.lookups - count)
                self._maybe_free(node)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._attr(self._node(inode))

    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        if fields.update_size:
            if node.is_dir:
                raise _fs_error(errno.EISDIR)
            path = self.live / str(node.ino)
            old = os.stat(path).st_size
            os.truncate(path, attr.st_size)
            self._mark_dirty(node, min(old, attr.st_size), max(old, attr.st_size))
        if fields.update_mode:
            node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(attr.st_mode)
        if fields.update_uid:
            node.uid = attr.st_uid
        if fields.update_gid:
            node.gid = attr.st_gid
        if fields.update_mtime:
            node.mtime_ns = attr.st_mtime_ns
        return self._attr(node)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        node = self._new_node(self._dir(parent_inode), name, stat.S_IFDIR | stat.S_IMODE(mode), ctx)
        return self._entry(node)

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        if not stat.S_ISREG(mode):
            raise _fs_error(errno.ENOTSUP)
        node = self._new_node(self._dir(parent_inode), name, mode, ctx)
        return self._new_handle(node), self._entry(node)

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if not stat.S_ISREG(mode):
            raise _fs_error(errno.ENOTSUP)  # only regular files and directories are modelled
        return self._entry(self._new_node(self._dir(parent_inode), name, mode, ctx))

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        parent = self._dir(parent_inode)
        ino = parent.entries.get(name)
        if ino is None:
            raise _fs_error(errno.ENOENT)
        node = self.nodes[ino]
        if node.is_dir:
            raise _fs_error(errno.EISDIR)
        del parent.entries[name]
        parent.mtime_ns = time.time_ns()
        node.links -= 1
        self._maybe_free(node)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        parent = self._dir(parent_inode)
        ino = parent.entries.get(name)
        if ino is None:
            raise _fs_error(errno.ENOENT)
        node = self.nodes[ino]
        if not node.is_dir:
            raise _fs_error(errno.ENOTDIR)
        if node.entries:
            raise _fs_error(errno.ENOTEMPTY)
        del parent.entries[name]
        parent.mtime_ns = time.time_ns()
        node.links = 0
        self._maybe_free(node)

    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: pyfuse3.RequestContext) -> None:
        if flags & ~pyfuse3.RENAME_NOREPLACE:
            raise _fs_error(errno.EINVAL)  # RENAME_EXCHANGE is not modelled
        old_dir, new_dir = self._dir(parent_inode_old), self._dir(parent_inode_new)
        ino = old_dir.entries.get(name_old)
        if ino is None:
            raise _fs_error(errno.ENOENT)
        node = self.nodes[ino]
        replaced_ino = new_dir.entries.get(name_new)
        if replaced_ino == ino:
            return
        if replaced_ino is not None:
            if flags & pyfuse3.RENAME_NOREPLACE:
                raise _fs_error(errno.EEXIST)
            replaced = self.nodes[replaced_ino]
            if replaced.is_dir != node.is_dir:
                raise _fs_error(errno.EISDIR if replaced.is_dir else errno.ENOTDIR)
            if replaced.is_dir and replaced.entries:
                raise _fs_error(errno.ENOTEMPTY)
        if node.is_dir:
            up = new_dir
            while True:  # a directory cannot move into itself
                if up.ino == node.ino:
                    raise _fs_error(errno.EINVAL)
                if up.ino == ROOT:
                    break
                up = self.nodes[up.parent]
        del old_dir.entries[name_old]
        new_dir.entries[name_new] = ino
        if node.is_dir:
            node.parent = new_dir.ino
        old_dir.mtime_ns = new_dir.mtime_ns = time.time_ns()
        if replaced_ino is not None:
            replaced.links = 0 if replaced.is_dir else replaced.links - 1
            self._maybe_free(replaced)

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        parent = self._dir(new_parent_inode)
        if node.is_dir:
            raise _fs_error(errno.EPERM)
        if new_name in parent.entries:
            raise _fs_error(errno.EEXIST)
        parent.entries[new_name] = node.ino
        node.links += 1
        return self._entry(node)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = self._dir(inode)
        fh = self._next_fh
        self._next_fh += 1
        # A snapshot, so positions stay valid while the directory changes.
        self.dir_handles[fh] = (inode, sorted(node.entries.items()))
        return fh

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        _, entries = self.dir_handles[fh]
        for i in range(start_id, len(entries)):
            name, ino = entries[i]
            node = self.nodes.get(ino)
            if node is None:
                continue
            if not pyfuse3.readdir_reply(token, name, self._attr(node), i + 1):
                break
            node.lookups += 1

    async def releasedir(self, fh: int) -> None:
        self.dir_handles.pop(fh, None)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        inode, _ = self.dir_handles[fh]
        await self._slow_disk()
        node = self.nodes.get(inode)
        if node is not None:
            self._sync_dir(node)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        host = os.statvfs(self.state)
        data = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                     "f_ffree", "f_favail", "f_namemax"):
            setattr(data, name, getattr(host, name))
        return data

    # -- file data

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if node.is_dir:
            raise _fs_error(errno.EISDIR)
        return self._new_handle(node)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        node = self.nodes[self.handles[fh]]
        return os.pread(self._open_fd(node), size, off)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        node = self.nodes[self.handles[fh]]
        written = os.pwrite(self._open_fd(node), buf, off)
        self._mark_dirty(node, off, off + written)
        return written

    async def flush(self, fh: int) -> None:
        pass  # close() promises nothing about durability

    async def fsync(self, fh: int, datasync: bool) -> None:
        ino = self.handles[fh]
        await self._slow_disk()
        node = self.nodes.get(ino)
        if node is not None:
            self._sync_file(node)

    async def release(self, fh: int) -> None:
        node = self.nodes.get(self.handles.pop(fh))
        if node is None:
            return
        node.opens -= 1
        if node.opens == 0 and node.fd is not None:
            os.close(node.fd)
            node.fd = None
        self._maybe_free(node)


async def _serve(fs: CrashFS) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pyfuse3.main)
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            words = line.split()
            if not words or words[0] == "cut":
                if words[1:2] == ["torn"]:
                    fs.tear(int(words[2]))
                fs.power_off()
                pyfuse3.terminate()
                return  # the nursery waits for the FUSE loop to finish
            if words[0] == "delay":
                fs.fsync_delay = float(words[1])
                print("ok", flush=True)
            else:
                print(f"error: unknown command {line.strip()!r}", flush=True)


def main(argv: list[str]) -> None:
    state, mountpoint = Path(argv[0]), Path(argv[1])
    fs = CrashFS(state)
    options = set(pyfuse3.default_options) | {"fsname=crashfs", "subtype=crashfs"}
    pyfuse3.init(fs, str(mountpoint), options)
    print("mounted", flush=True)
    try:
        trio.run(_serve, fs)
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    main(sys.argv[1:])
