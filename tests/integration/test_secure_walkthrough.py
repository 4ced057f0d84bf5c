"""The "Securing Strom" walkthrough (its ACL lines as the README prints them), step by step, as a
user would run it: certificates from
examples/secure/make-certs (openssl), a broker from config/secure.properties, the admin's
commands with examples/secure/admin.properties, a SCRAM user, and each client library through
examples/secure/clients.py. Only the port and paths differ (ephemeral, temporary)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from strom.config.broker import read_properties
from strom.testing import BrokerProcess

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory):
    work = tmp_path_factory.mktemp("secure")
    subprocess.run([str(REPO / "examples/secure/make-certs"), str(work / "secrets")], check=True, timeout=60,
                   capture_output=True)
    props = read_properties(REPO / "config/secure.properties")
    props.update({"listeners": "SASL_SSL://127.0.0.1:0", "log.dirs": str(work / "data"),
                  "ssl.keystore.location": str(work / "secrets/broker.pem")})
    with BrokerProcess(overrides=props) as broker:
        bootstrap = f"127.0.0.1:{broker.ports['SASL_SSL']}"
        admin = (REPO / "examples/secure/admin.properties").read_text()
        admin = admin.replace("127.0.0.1:9093", bootstrap).replace("secrets/ca.pem", str(work / "secrets/ca.pem"))
        (work / "admin.properties").write_text(admin)
        yield broker, bootstrap, work


def strom(work: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "strom", *args, "--command-config", str(work / "admin.properties")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_admin_sets_up_users_a_topic_and_acls(walkthrough):
    _, _, work = walkthrough
    for user in ("alice", "bob"):
        assert f"Set SCRAM-SHA-512 credential for user {user}." in strom(
            work, "users", "scram-set", user, "--mechanism", "SCRAM-SHA-512", "--password", f"{user}-secret")
    assert "Created topic orders." in strom(work, "topics", "create", "orders", "--partitions", "3")
    # The README's ACL lines, as printed there (their $admin is this run's admin properties).
    section = (REPO / "README.md").read_text().split("\n## Securing Strom\n", 1)[1].split("\n## ", 1)[0]
    lines = [line.split()[1:-1] for line in section.splitlines() if line.startswith(".venv/bin/strom acls add ")]
    assert [line[-1] for line in lines] == ["orders", "orders", "prefixed"]
    added = [strom(work, *line) for line in lines]
    assert [a.strip() for a in added] == ["Added 3 ACL(s).", "Added 2 ACL(s).", "Added 1 ACL(s)."]
    listed = strom(work, "acls", "list", "--topic", "orders")
    assert "(principal=User:alice, host=*, operation=WRITE, permissionType=ALLOW) on TOPIC:LITERAL:orders" in listed


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python", "aiokafka", "pyspark"])
def test_each_client_library_as_the_user(walkthrough, client):
    _, bootstrap, work = walkthrough
    done = subprocess.run([sys.executable, str(REPO / "examples/secure/clients.py"), "--client", client,
                           "--bootstrap", bootstrap, "--ca", str(work / "secrets/ca.pem")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{client}: wrote 3 records to orders as alice and read back 3" in done.stdout


def test_a_user_without_acls_is_refused(walkthrough):
    _, bootstrap, work = walkthrough
    done = subprocess.run([sys.executable, str(REPO / "examples/secure/clients.py"), "--client", "confluent-kafka",
                           "--bootstrap", bootstrap, "--ca", str(work / "secrets/ca.pem"), "--user", "bob",
                           "--password", "bob-secret"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "TOPIC_AUTHORIZATION_FAILED" in done.stderr


def test_a_wrong_password_is_turned_away(walkthrough):
    _, bootstrap, work = walkthrough
    wrong = work / "wrong.properties"
    wrong.write_text((work / "admin.properties").read_text().replace("admin-secret", "guess"))
    done = subprocess.run([sys.executable, "-m", "strom", "topics", "list", "--command-config", str(wrong)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith(f"Error: authentication with {bootstrap} failed: Authentication failed")
