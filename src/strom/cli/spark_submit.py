"""`strom spark-submit APP.py [ARGS...]`: Spark's spark-submit, run with the PySpark and the
Python that Strom is installed in.

PySpark's own `spark-submit` (the one pip puts beside it) finds its Spark with `python3` from
PATH, and Spark then runs the application, looks data sources up and starts its Python workers
with `PYSPARK_DRIVER_PYTHON` / `PYSPARK_PYTHON`, else `python3` again: from a virtualenv that
is not on PATH it fails with "Could not find valid SPARK_HOME", or runs where there is no Strom
(no `format("strom")`). This command sets SPARK_HOME to its PySpark's Spark and both variables
to its own interpreter, unless they are set already, and hands every argument to Spark's
spark-submit unchanged:

    strom spark-submit --master 'local[2]' clicks.py --bootstrap 127.0.0.1:9092
"""

from __future__ import annotations

import os
import sys
from importlib.util import find_spec
from pathlib import Path

import click

from strom.cli.common import CommandError


def spark_home() -> Path:
    """The Spark a pip-installed PySpark carries (its package directory: bin/, jars/)."""
    spec = find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise CommandError(f"PySpark is not installed in {sys.executable}: pip install 'strom[spark]'")
    return Path(next(iter(spec.submodule_search_locations)))


def submit_environment(environ: dict[str, str]) -> dict[str, str]:
    """`environ` with what Spark needs to run this Python's PySpark and Strom, where unset."""
    env = dict(environ)
    env.setdefault("SPARK_HOME", str(spark_home()))
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        env.setdefault(name, sys.executable)
    return env


@click.command("spark-submit", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                                 "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def spark_submit(args: tuple[str, ...]) -> None:
    """Run Spark's spark-submit (every argument is its own: `strom spark-submit --help` shows
    Spark's help) with SPARK_HOME, PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON set to this
    installation's PySpark and Python where they are unset.

    \b
    Example:
      strom spark-submit --master 'local[2]' clicks.py
    """
    env = submit_environment(dict(os.environ))
    program = Path(env["SPARK_HOME"]) / "bin" / "spark-submit"
    if not program.is_file():
        raise CommandError(f"SPARK_HOME={env['SPARK_HOME']} has no bin/spark-submit")
    sys.stdout.flush()
    try:
        os.execve(program, [str(program), *args], env)
    except OSError as e:
        raise CommandError(f"cannot run {program}: {e.strerror or e}") from None
