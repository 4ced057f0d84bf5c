"""What installing the connector brings, and what a user sees when the interpreter Spark runs
lacks some of it: the `spark` extra covers every module the connector imports, the connector
imports nothing of the broker, and a Spark application whose Python lacks a dependency, or
Strom itself, is told which and what to do (one Spark JVM: it costs half a minute). That the
README's example runs through `strom spark-submit` with no PYSPARK_PYTHON set is
tests/test_readme.py's test_pyspark."""

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


def imports(path: Path, *, top_level: bool = False) -> set[str]:
    """Every module a file imports, at the top or inside functions (only at the top with
    `top_level`: what importing the module needs), absolute names."""
    found = set()
    todo: list[ast.AST] = [ast.parse(path.read_text())]
    while todo:
        node = todo.pop()
        if not (top_level and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)):
            todo.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)  # perhaps modules
    return found


def strom_module_file(name: str) -> Path | None:
    base = REPO / "src" / Path(*name.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def connector_files() -> list[Path]:
    """The connector's files and those of the other Strom modules it imports, transitively:
    shared code such as strom.schemas brings its own third-party imports (theirs at the top
    only: one imported inside a function is an optional feature's, named when it is missing)."""
    own = [p for d in CONNECTOR for p in sorted(d.rglob("*.py"))]
    todo, seen = list(own), list(own)
    while todo:
        path = todo.pop()
        for name in imports(path, top_level=path not in own):
            found = strom_module_file(name) if name.startswith("strom.") else None
            if found is not None and found not in seen:
                seen.append(found)
                todo.append(found)
    return seen


def third_party_of(path: Path, own: list[Path]) -> set[str]:
    return {name.split(".")[0] for name in imports(path, top_level=path not in own)}


def third_party() -> set[str]:
    own = [p for d in CONNECTOR for p in d.rglob("*.py")]
    tops = {top for p in connector_files() for top in third_party_of(p, own)}
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


def worker_python(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter for Spark's Python processes, and the file that says what it lacks: this
    interpreter without its site-packages, with the connector's dependencies and Strom's source
    on its path but, as the file names them when it starts, without `strom` (Strom) or without
    one dependency (`confluent_kafka`)."""
    site = Path(importlib.metadata.distribution("pyarrow").locate_file(""))
    for name in pyspark_strom.NEEDS:
        libs = tmp_path / f"libs-without-{name}"
        libs.mkdir()
        for other in pyspark_strom.NEEDS:
            if other != name:
                (libs / other).symlink_to(site / other)
    everything = tmp_path / "libs-without-strom"
    everything.mkdir()
    for name in pyspark_strom.NEEDS:
        (everything / name).symlink_to(site / name)
    without = tmp_path / "without"
    script = tmp_path / "python"
    script.write_text(f"""#!/bin/sh
lacks=$(cat {without})
if [ "$lacks" = strom ]; then path={everything}; else path={tmp_path}/libs-without-$lacks:{REPO / "src"}; fi
PYTHONPATH="$PYTHONPATH:$path" exec {sys.executable} -S "$@"
""")
    script.chmod(0o755)
    return script, without


# One driver, one JVM, for both ways Spark's Python can fall short. Spark looks Python data
# sources up once per JVM (DataSourceManager keeps what it found, and a context's sessions what
# they were given): between the two cases the lookup is forgotten and a new context started in
# the same JVM, as a new JVM would start with none, so that the second case is looked up again
# with what the interpreter then lacks.
DIAGNOSES = """
import sys
from pathlib import Path
from pyspark.sql import SparkSession

bootstrap, topic, without = sys.argv[1], sys.argv[2], Path(sys.argv[3])
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
print("GATEWAY", id(spark.sparkContext._gateway))

def load(case):
    try:
        spark.read.format("strom").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic).load()
        print(case, "LOADED")
    except Exception as e:
        print(case, "FAILED:", " ".join(str(e).split()))

without.write_text("confluent_kafka")
load("DEPENDENCY")
import strom.spark
without.write_text("strom")
jvm = spark.sparkContext._jvm
manager = getattr(getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSourceManager$"), "MODULE$")
getattr(manager, "dataSourceBuilders_$eq")(jvm.scala.Option.empty())
spark.stop()  # a new context in the same JVM: its sessions ask for the lookup again
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
load("STROM")
print("GATEWAY", id(spark.sparkContext._gateway))
"""


def test_a_missing_dependency_or_strom_itself_is_named(broker, topic, tmp_path):
    """Spark's Python has Strom but not confluent-kafka (what `pip install '.[spark]'` used to
    leave out): the source says so, instead of Spark's bare "failed to find the data source".
    Then it has no Strom at all (PYSPARK_PYTHON left to another Python): with strom.spark
    imported in the driver, the error names that interpreter and the fix."""
    create_topic(broker.bootstrap, topic)
    python, without = worker_python(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_DRIVER_PYTHON"}
    env["PYSPARK_PYTHON"] = str(python)
    (tmp_path / "driver.py").write_text(DIAGNOSES)
    done = subprocess.run([sys.executable, "driver.py", broker.bootstrap, topic, str(without)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    lines = {line.split(" ", 1)[0]: line for line in done.stdout.splitlines() if " " in line}
    assert "STROM" in lines, f"exit {done.returncode}: {done.stdout}{done.stderr[-3000:]}"
    gateways = [line for line in done.stdout.splitlines() if line.startswith("GATEWAY")]
    assert len(gateways) == 2 and gateways[0] == gateways[1]  # one JVM for both
    dependency, strom = lines["DEPENDENCY"], lines["STROM"]
    assert "FAILED:" in dependency
    assert "No module named 'confluent_kafka'" in dependency
    assert "pip install 'strom[spark]'" in dependency
    assert "DATA_SOURCE_NOT_FOUND" not in dependency
    assert "FAILED:" in strom
    assert f"it looks data sources up with '{python}'" in strom
    assert "which does not have Strom" in strom
    assert f"PYSPARK_PYTHON={sys.executable}" in strom
