"""What installing the connector brings, and what a user sees when the interpreter Spark runs
lacks some of it: the `spark` extra covers every module the connector imports, the connector
imports nothing of the broker, and a Spark application whose Python lacks a dependency, or
Strom itself, is told which and what to do."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pyspark_strom
from strom.testing import create_topic

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = [REPO / "src/strom/spark", REPO / "src/pyspark_strom"]
BROKER_SIDE = ("server", "network", "security", "config", "controller", "coordinator", "log", "metadata")


def imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside functions, absolute names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)  # perhaps modules
    return found


def connector_files() -> list[Path]:
    return [p for d in CONNECTOR for p in sorted(d.rglob("*.py"))]


def third_party() -> set[str]:
    tops = {name.split(".")[0] for p in connector_files() for name in imports(p)}
    return {t for t in tops if t not in sys.stdlib_module_names and t not in ("strom", "pyspark_strom", "__future__")}


def canonical(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_the_spark_extra_brings_what_the_connector_imports():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    installed = {canonical(r) for r in project["dependencies"] + project["optional-dependencies"]["spark"]}
    distributions = importlib.metadata.packages_distributions()
    modules = third_party()
    assert {"pyspark", "pyarrow", "confluent_kafka", "aiokafka", "kafka"} <= modules
    for module in modules:
        assert {canonical(d) for d in distributions[module]} & installed, f"{module} is in no installed extra"
    # The lookup module checks for exactly those (PySpark itself is there when it runs).
    assert set(pyspark_strom.NEEDS) == modules - {"pyspark"}


def test_the_connector_imports_nothing_of_the_broker_and_has_no_import_cycle():
    names = {f"strom.spark.{p.stem}" for p in (REPO / "src/strom/spark").glob("*.py") if p.stem != "__init__"}
    graph = {}
    for path in (REPO / "src/strom/spark").glob("*.py"):
        mine = imports(path)
        broker = [m for m in mine if m.split(".")[:2] in [["strom", side] for side in BROKER_SIDE]]
        assert not broker, f"{path.name} imports {broker}"
        if path.stem != "__init__":
            graph[f"strom.spark.{path.stem}"] = {m for m in mine if m in names}

    def cycle_from(node: str, trail: list[str]) -> list[str] | None:
        if node in trail:
            return trail[trail.index(node):] + [node]
        for nxt in graph.get(node, ()):
            found = cycle_from(nxt, trail + [node])
            if found:
                return found
        return None

    for node in graph:
        assert cycle_from(node, []) is None, " -> ".join(cycle_from(node, []))
    # And in a running interpreter, transitively.
    loaded = subprocess.run([sys.executable, "-c", "import sys, pyspark_strom, strom.spark.source, strom.spark.sink, "
                             "strom.spark.txn, strom.spark.fetch, strom.spark.offsets; print(' '.join(sys.modules))"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert [m for m in loaded if m.split(".")[:2] in [["strom", s] for s in BROKER_SIDE]] == []


def worker_python(tmp_path: Path, *, strom: bool, without: str | None = None) -> Path:
    """An interpreter for Spark's Python processes: this one without its site-packages, with
    Strom's source (`strom`) and the connector's dependencies but `without` on its path."""
    site = Path(importlib.metadata.distribution("pyarrow").locate_file(""))
    libs = tmp_path / "libs"
    libs.mkdir()
    for name in pyspark_strom.NEEDS:
        if name != without:
            (libs / name).symlink_to(site / name)
    path = [str(libs)] + ([str(REPO / "src")] if strom else [])
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{":".join(path)}" exec {sys.executable} -S "$@"\n')
    script.chmod(0o755)
    return script


def run_driver(code: str, python: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_DRIVER_PYTHON"}
    env["PYSPARK_PYTHON"] = str(python)
    (tmp_path / "driver.py").write_text(code)
    return subprocess.run([sys.executable, str(tmp_path / "driver.py"), *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


READ = """
import sys
{imports}
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
try:
    spark.read.format("strom").option("kafka.bootstrap.servers", sys.argv[1]).option("subscribe", sys.argv[2]).load()
    print("LOADED")
except Exception as e:
    print("FAILED:", e)
"""


def test_a_missing_dependency_is_named(broker, topic, tmp_path):
    """Spark's Python has Strom but not confluent-kafka (what `pip install '.[spark]'` used to
    leave out): the source says so, instead of Spark's bare "failed to find the data source"."""
    create_topic(broker.bootstrap, topic)
    python = worker_python(tmp_path, strom=True, without="confluent_kafka")
    done = run_driver(READ.format(imports=""), python, tmp_path, broker.bootstrap, topic)
    assert "FAILED:" in done.stdout, f"exit {done.returncode}: {done.stdout}{done.stderr[-3000:]}"
    assert "No module named 'confluent_kafka'" in done.stdout
    assert "pip install 'strom[spark]'" in done.stdout
    assert "DATA_SOURCE_NOT_FOUND" not in done.stdout


def test_a_python_without_strom_is_named(broker, topic, tmp_path):
    """The lookup runs an interpreter without Strom (PYSPARK_PYTHON left to another Python):
    with strom.spark imported in the driver, the error names that interpreter and the fix."""
    create_topic(broker.bootstrap, topic)
    python = worker_python(tmp_path, strom=False)
    done = run_driver(READ.format(imports="import strom.spark"), python, tmp_path, broker.bootstrap, topic)
    assert "FAILED:" in done.stdout, f"exit {done.returncode}: {done.stdout}{done.stderr[-3000:]}"
    assert f"it looks data sources up with '{python}'" in done.stdout
    assert "which does not have Strom" in done.stdout
    assert f"PYSPARK_PYTHON={sys.executable}" in done.stdout
