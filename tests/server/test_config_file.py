"""The shipped config/server.properties starts a broker as the README says it does."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

SERVER_PROPERTIES = Path(__file__).resolve().parents[2] / "config" / "server.properties"


def test_the_shipped_server_properties_starts_a_broker(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "strom", "serve", str(SERVER_PROPERTIES),
         "--override", "listeners=PLAINTEXT://127.0.0.1:0", "--override", f"log.dirs={tmp_path}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline()
        assert re.search(r"ready on PLAINTEXT://127\.0\.0\.1:\d+", ready), ready + proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert "WARNING" not in err and "ERROR" not in err, err[-2000:]
    assert (tmp_path / "meta.properties").exists()


def test_every_key_it_sets_is_one_strom_knows():
    from strom.server.config import DEFINITIONS

    keys = [line.split("=", 1)[0].lstrip("#").strip() for line in SERVER_PROPERTIES.read_text().splitlines()
            if "=" in line and not line.startswith("# ")]
    assert keys and not [k for k in keys if k not in DEFINITIONS]
