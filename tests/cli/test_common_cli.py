"""What every client command shares: --bootstrap-server with one default, --command-config,
--help with examples, and one way to fail (exit 1 with one line; 2 for a wrong command line),
run against a real broker, a port nobody listens on, and a socket that never answers."""

from __future__ import annotations

import re
import socket
import threading

import pytest
from click.testing import CliRunner

from strom.cli.main import main

from .conftest import fails, ok

pytestmark = pytest.mark.timeout(120)

CLIENT_COMMANDS = [
    ("topics", "create"), ("topics", "list"), ("topics", "describe"), ("topics", "alter"),
    ("topics", "delete"), ("groups", "list"), ("groups", "describe"), ("groups", "delete"),
    ("groups", "reset-offsets"), ("groups", "delete-offsets"), ("configs", "describe"),
    ("configs", "alter"), ("reassign-partitions",), ("produce",), ("consume",), ("get-offsets",),
]
# One command of each kind of request path: bootstrap metadata, every broker, the controller,
# a group coordinator, partition leaders.
ADMIN_CALLS = [
    ("topics", "list"), ("groups", "list"), ("configs", "describe", "--topic", "t"),
    ("reassign-partitions", "--list"), ("groups", "describe", "g"), ("get-offsets",),
    ("topics", "create", "t"),
]


@pytest.mark.parametrize("command", CLIENT_COMMANDS, ids=" ".join)
def test_help_shows_the_shared_options_and_examples(command):
    result = CliRunner().invoke(main, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "--bootstrap-server HOST:PORT[,...]" in result.output
    assert "[default: 127.0.0.1:9092]" in result.output
    assert re.search(r"--command-config(, --\w+\.config)? FILE", result.output)
    assert "Example" in result.output and "\n    strom " in result.output


def test_every_command_has_examples_and_the_exit_codes_are_documented():
    runner = CliRunner()
    top = runner.invoke(main, ["--help"], terminal_width=200)
    assert "exits 0 on success, 1 when the operation failed" in top.output.replace("\n  ", " ")
    for command in (["dump-log"], ["cluster", "up"]):
        assert runner.invoke(main, [*command, "--help"]).exit_code == 0
    assert "Example:" in runner.invoke(main, ["dump-log", "--help"]).output
    assert "Run a broker" in runner.invoke(main, ["serve", "--help"]).output


@pytest.mark.parametrize("command", ADMIN_CALLS, ids=" ".join)
def test_unreachable_broker_is_one_line(command):
    assert fails(*command, "--bootstrap-server", "127.0.0.1:1") == \
        "Error: cannot connect to 127.0.0.1:1: connection refused"


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and re.fullmatch(r"strom \d+\.\d+\.\d+\S*\n", result.output), result.output


def test_a_listener_port_out_of_range_is_named():
    assert fails("serve", "--override", "listeners=PLAINTEXT://127.0.0.1:99999", code=2) == \
        "strom: invalid value for listeners: 'PLAINTEXT://127.0.0.1:99999': port 99999 is out of range (0-65535)"
    assert "not of the form NAME://host:port" in fails(
        "serve", "--override", "listeners=PLAINTEXT:/127.0.0.1:9092", code=2)


def test_cluster_up_refuses_a_zookeeper_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = fails("cluster", "up", "--zookeeper-port", str(port), "--data-dir", str(tmp_path / "c"))
    assert line == (f"strom: port {port} is in use (a ZooKeeper already running?): --zookeeper "
                    f"127.0.0.1:{port} joins it, --zookeeper-port 0 picks a free port")


def test_wrong_command_lines_exit_2(cli_broker):
    for value in ("localhost", "host:port", "127.0.0.1:70000", ","):
        assert "--bootstrap-server" in fails("topics", "list", "--bootstrap-server", value, code=2)
    assert "does not exist" in fails("topics", "list", "--command-config", "/nonexistent.properties", code=2)
    assert "No such option" in fails("groups", "list", "--bogus", code=2)


def test_command_config(cli_broker, tmp_path):
    bootstrap = cli_broker.bootstrap
    props = tmp_path / "admin.properties"
    props.write_text(f"bootstrap.servers={bootstrap}\nclient.id=ops-console\n")
    # bootstrap.servers from the file when --bootstrap-server is not given...
    ok("topics", "create", "from-file-topic", "--command-config", str(props))
    assert "from-file-topic" in ok("topics", "list", "--command-config", str(props)).split()
    # ...and --bootstrap-server over it.
    assert "connection refused" in fails("topics", "list", "--command-config", str(props),
                                         "--bootstrap-server", "127.0.0.1:1")
    # A list of servers: the first that answers is used.
    ok("groups", "list", "--bootstrap-server", f"127.0.0.1:1,{bootstrap}")
    # TLS asked of a plaintext listener fails in one line; a protocol Kafka does not have is refused.
    props.write_text(f"bootstrap.servers={bootstrap}\nsecurity.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n")
    assert fails("topics", "list", "--command-config", str(props)).startswith(f"Error: cannot connect to {bootstrap}: ")
    props.write_text(f"bootstrap.servers={bootstrap}\nsecurity.protocol=KERBEROS\n")
    assert fails("topics", "list", "--command-config", str(props)) == \
        "Error: --command-config: security.protocol=KERBEROS is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
    props.write_text("this line is not a property\n")
    assert "expected key=value" in fails("topics", "list", "--command-config", str(props), code=2)


def test_request_timeout_from_command_config(tmp_path):
    """A server that accepts connections and never answers: the command gives up after
    request.timeout.ms and says which server did not answer."""
    silent = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        silent.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(silent.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        props = tmp_path / "slow.properties"
        props.write_text("request.timeout.ms=700\n")
        assert fails("topics", "list", "--bootstrap-server", address, "--command-config", str(props)) == \
            f"Error: {address} did not answer within 0.7 s"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        silent.close()
