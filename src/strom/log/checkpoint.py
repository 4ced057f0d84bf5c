"""Kafka's offset checkpoint files (recovery-point-offset-checkpoint, log-start-offset-checkpoint).

Text format: a version line (`0`), an entry count line, then `topic partition offset` per line.
Written atomically (temp file, fsync, rename, fsync of the directory) because a torn checkpoint
would make the next start-up either skip needed recovery or fail.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

VERSION = 0


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """{(topic, partition): offset}; {} when the file does not exist; ValueError if malformed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError:
        raise ValueError(f"malformed checkpoint file {path}: not text") from None
    lines = text.splitlines()
    try:
        if len(lines) < 2:
            raise ValueError("missing version or entry count line")
        version = int(lines[0].strip())
        if version != VERSION:
            raise ValueError(f"unsupported version {version}")
        count = int(lines[1].strip())
        rows = [line for line in lines[2:] if line.strip()]
        if count != len(rows):
            raise ValueError(f"expected {count} entries, found {len(rows)}")
        entries: dict[tuple[str, int], int] = {}
        for row in rows:
            fields = row.split()
            if len(fields) != 3:
                raise ValueError(f"expected 'topic partition offset', got {row!r}")
            topic, partition, offset = fields[0], int(fields[1]), int(fields[2])
            entries[(topic, partition)] = offset
    except ValueError as e:
        raise ValueError(f"malformed checkpoint file {path}: {e}") from None
    return entries


def write_checkpoint(path: Path, entries: Mapping[tuple[str, int], int]) -> None:
    """Replace `path` atomically with `entries`."""
    path = Path(path)
    lines = [str(VERSION), str(len(entries))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(entries.items())]
    write_atomically(path, "\n".join(lines) + "\n")


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text`: temp file, fsync, rename, fsync of the directory."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
