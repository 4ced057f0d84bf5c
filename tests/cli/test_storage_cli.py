"""`strom storage info` prints what Kafka's `kafka-storage.sh info` prints, line for line, so a
script that parses Kafka's output parses Strom's. No broker: only directories."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import ok, strom


def _config(tmp_path: Path, *log_dirs: Path, metadata_dir: Path | None = None) -> Path:
    lines = ["process.roles=broker", "node.id=7", "controller.quorum.voters=1@127.0.0.1:9093",
             "controller.listener.names=CONTROLLER", "listeners=PLAINTEXT://127.0.0.1:0",
             "log.dirs=" + ",".join(str(d) for d in log_dirs)]
    if metadata_dir is not None:
        lines.append(f"metadata.log.dir={metadata_dir}")
    path = tmp_path / "server.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_info_of_a_formatted_directory(tmp_path):
    data = tmp_path / "data"
    config = _config(tmp_path, data)
    cluster_id = ok("storage", "random-uuid").strip()
    ok("storage", "format", "-t", cluster_id, "-c", str(config))
    directory_id = dict(line.split("=", 1) for line in (data / "meta.properties").read_text().splitlines()
                        if "=" in line and not line.startswith("#"))["directory.id"]

    done = strom("storage", "info", "-c", str(config))

    assert done.returncode == 0, done
    assert done.stdout == (f"Found log directory:\n  {data}\n\n"
                           f"Found metadata: {{cluster.id={cluster_id}, directory.id={directory_id}, "
                           f"node.id=7, version=1}}\n\n")


def test_info_names_a_missing_and_an_unformatted_directory(tmp_path):
    missing, empty = tmp_path / "a-missing", tmp_path / "b-empty"
    empty.mkdir()
    config = _config(tmp_path, empty, missing)

    done = strom("storage", "info", "-c", str(config))

    assert done.returncode == 1, done
    assert done.stdout == (f"Found log directory:\n  {empty}\n\n"
                           f"Found problems:\n  {missing} does not exist\n  {empty} is not formatted.\n\n")
    assert "Traceback" not in done.stderr


def test_info_finds_a_zookeeper_mode_directory_and_a_broken_one(tmp_path):
    legacy, broken = tmp_path / "a", tmp_path / "b"
    for d in (legacy, broken):
        d.mkdir()
    (legacy / "meta.properties").write_text("version=0\nbroker.id=7\ncluster.id=26c36907-4158-4a35\n")
    (broken / "meta.properties").write_text("version=1\ncluster.id=QW04la-GT-6IlGOw0CSKJQ\n")
    config = _config(tmp_path, broken, metadata_dir=legacy)

    done = strom("storage", "info", "-c", str(config))

    assert done.returncode == 1, done
    assert done.stdout == (f"Found log directories:\n  {legacy}\n  {broken}\n\n"
                           "Found metadata: {broker.id=7, cluster.id=26c36907-4158-4a35, version=0}\n\n"
                           f"Found problems:\n  Error loading {broken / 'meta.properties'}: Failed to find node.id\n"
                           "  The kafka configuration file appears to be for a cluster in KRaft mode, but the "
                           "directories are formatted for legacy mode.\n\n")
