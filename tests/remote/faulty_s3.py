"""A proxy in front of a real S3 server that misbehaves on purpose: answers some requests 503
without passing them on, passes some on and then cuts the answer's body short, delays others.
The client signs its requests for the proxy's address, which the proxy passes on unchanged, so
the server checks the same signature it would see directly."""

from __future__ import annotations

import http.client
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class FaultyS3Proxy:
    def __init__(self, upstream: str, *, fail: float = 0.0, truncate: float = 0.0, delay_s: float = 0.0,
                 seed: int = 1) -> None:
        self.upstream = urlsplit(upstream)
        self.fail, self.truncate, self.delay_s = fail, truncate, delay_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {"passed": 0, "failed": 0, "truncated": 0}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                roll = proxy.roll()
                if proxy.delay_s:
                    time.sleep(proxy.delay_s)
                if roll == "failed":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                    answer = conn.getresponse()
                    data = answer.read()
                finally:
                    conn.close()
                self.send_response(answer.status)
                head = self.command == "HEAD"  # no body: the object's length stays as the server said
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection") and (head or key.lower() != "content-length"):
                        self.send_header(key, value)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if head:
                    return
                if roll == "truncated" and self.command == "GET" and len(data) > 16:
                    self.wfile.write(data[: len(data) // 2])  # the rest never comes
                    self.close_connection = True
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def roll(self) -> str:
        with self.lock:
            r = self.rng.random()
            outcome = "failed" if r < self.fail else "truncated" if r < self.fail + self.truncate else "passed"
            self.counts[outcome] += 1
            return outcome

    def __enter__(self) -> FaultyS3Proxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
