"""An HTTP proxy on 127.0.0.1 that adds latency and faults between an S3 client and a real S3 server.

Why: an object store's round trip (10-30 ms in a cloud region) and its passing faults (a reset connection, a body
cut mid-response, ``503 SlowDown``, an outage) are what remote reading must survive; a server on the same machine
has none of them. The proxy speaks just enough HTTP/1.1 (keep-alive, ``Content-Length`` and chunked bodies) to
forward each request over its own connection to the server, then:

- waits ``delay_s`` before answering (a fixed delay per request, as a round trip adds), and ``list_delay_s`` more
  before answering a listing (a late listing: what a reader must not serve rows before);
- with probability ``reset``: closes the client's connection with an RST instead of answering;
- with probability ``cut``: sends the headers and half the body (``Content-Length`` as announced), then closes;
- with probability ``slowdown``: answers ``503 SlowDown`` (S3's throttling reply) without asking the server;
- with ``outage=True``: answers every request ``503 ServiceUnavailable`` (a persistent outage).

Counts requests by method and by kind (``counts``), so a benchmark can report requests per row group. Settings are
attributes, changed between runs (``configure``); faults are drawn from one seeded generator.
"""
from __future__ import annotations

import json
import random
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from http.client import HTTPConnection

SLOWDOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code><Message>Please reduce your "
            b"request rate.</Message></Error>")
UNAVAILABLE = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>ServiceUnavailable</Code><Message>Service "
               b"is unable to handle request.</Message></Error>")
CONTROL = "/__fault_proxy__/"
HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class FaultProxy:
    """``FaultProxy(upstream_host, upstream_port)``; ``.endpoint`` is ``http://127.0.0.1:PORT``; ``close()``."""

    def __init__(self, upstream_host: str, upstream_port: int, *, seed: int = 0):
        self.upstream = (upstream_host, upstream_port)
        self.delay_s = self.list_delay_s = 0.0
        self.reset = self.cut = self.slowdown = 0.0
        self.outage = False
        self.counts: Counter = Counter()
        self.log: list = []  # (time.monotonic(), method, target's path end, kind) of each request since configure
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                proxy._serve(self.request)

        class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="fault-proxy")
        self._thread.start()

    def configure(self, *, delay_s: float = 0.0, reset: float = 0.0, cut: float = 0.0, slowdown: float = 0.0,
                  outage: bool = False, seed: int | None = None, list_delay_s: float = 0.0) -> None:
        with self._lock:
            self.delay_s, self.reset, self.cut, self.slowdown, self.outage = delay_s, reset, cut, slowdown, outage
            self.list_delay_s = list_delay_s
            if seed is not None:
                self._rng = random.Random(seed)
            self.counts = Counter()
            self.log = []

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _control(self, target: str, body: bytes) -> bytes:
        if target == CONTROL + "configure":
            self.configure(**json.loads(body))
        with self._lock:
            if target == CONTROL + "log":
                return json.dumps(self.log).encode()
            return json.dumps(dict(self.counts)).encode()


    def _draw(self) -> str:
        with self._lock:
            if self.outage:
                return "outage"
            x = self._rng.random()
            for name in ("reset", "cut", "slowdown"):
                rate = getattr(self, name)
                if x < rate:
                    return name
                x -= rate
            return "ok"

    def _serve(self, client: socket.socket) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = client.makefile("rb")
        upstream: HTTPConnection | None = None
        try:
            while True:
                request = _read_request(reader, client)
                if request is None:
                    return
                method, target, headers, body = request
                if target.startswith(CONTROL):  # ProxyProcess's settings and counts, never forwarded
                    _send(client, 200, "OK", [("Content-Type", "application/json")], self._control(target, body),
                          method)
                    continue
                kind = _kind(method, target, headers)
                with self._lock:
                    self.counts[method] += 1
                    self.counts[kind] += 1
                    self.log.append((time.monotonic(), method, target.split("?")[0][-40:], kind))
                    delay = self.delay_s + (self.list_delay_s if kind == "list" else 0.0)
                if delay:
                    time.sleep(delay)
                fault = self._draw()
                with self._lock:
                    self.counts["fault:" + fault] += 1
                if fault == "reset":
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if fault in ("slowdown", "outage"):
                    payload = SLOWDOWN if fault == "slowdown" else UNAVAILABLE
                    _send(client, 503, "Slow Down" if fault == "slowdown" else "Service Unavailable",
                          [("Content-Type", "application/xml")], payload, method)
                    continue
                if upstream is None:
                    upstream = HTTPConnection(*self.upstream, timeout=60)
                forwarded = {k: v for k, v in headers if k.lower() not in HOP}
                upstream.request(method, target, body=body, headers=forwarded)
                response = upstream.getresponse()
                data = response.read()
                drop = HOP if method == "HEAD" else HOP | {"content-length"}  # a HEAD tells the object's length
                out = [(k, v) for k, v in response.getheaders() if k.lower() not in drop]
                if fault == "cut" and method != "HEAD" and len(data) > 1:
                    head = _head(response.status, response.reason, out, len(data))
                    client.sendall(head + data[:len(data) // 2])
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                _send(client, response.status, response.reason, out, data, method)
        except (OSError, ValueError):
            return
        finally:
            if upstream is not None:
                upstream.close()
            try:
                client.close()
            except OSError:
                pass



class ProxyProcess:
    """A ``FaultProxy`` in its own process (``python tests/fault_proxy.py HOST PORT``), with the same
    ``endpoint``, ``configure`` and ``counts``: a benchmark's proxy must not share the loader's GIL, or the
    proxy's Python work slows the very loader it measures (and raw pyarrow less)."""

    def __init__(self, upstream_host: str, upstream_port: int, *, seed: int = 0):
        import subprocess
        import sys
        self._process = subprocess.Popen([sys.executable, __file__, upstream_host, str(upstream_port), str(seed)],
                                         stdout=subprocess.PIPE, text=True)
        self.endpoint = self._process.stdout.readline().strip()  # type: ignore[union-attr]

    def _call(self, name: str, settings: dict | None = None) -> dict:
        import urllib.request
        request = urllib.request.Request(self.endpoint + CONTROL + name, data=json.dumps(settings or {}).encode(),
                                         method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def configure(self, **settings) -> None:
        self._call("configure", settings)

    @property
    def counts(self) -> Counter:
        return Counter(self._call("counts"))

    @property
    def log(self) -> list:
        """``FaultProxy.log`` of the proxy's process (``time.monotonic()`` is one clock for every process)."""
        return [tuple(entry) for entry in self._call("log")]

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)


def _kind(method: str, target: str, headers) -> str:
    if method == "GET" and ("list-type=" in target or target.rstrip("/").count("/") <= 1 or "?" in target
                            and "prefix=" in target):
        return "list"
    if method == "GET":
        ranged = any(k.lower() == "range" for k, _ in headers)
        return "get-range" if ranged else "get"
    return method.lower()


def _head(status: int, reason: str, headers, length: int | None) -> bytes:
    size = [] if length is None else [f"Content-Length: {length}"]
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers] + size + ["", ""]
    return "\r\n".join(lines).encode("latin-1")


def _send(client: socket.socket, status: int, reason: str, headers, data: bytes, method: str) -> None:
    if method == "HEAD":
        known = any(k.lower() == "content-length" for k, _ in headers)
        client.sendall(_head(status, reason, headers, None if known else 0))
    else:
        client.sendall(_head(status, reason, headers, len(data)) + data)


def _read_request(reader, client=None):
    line = reader.readline(65537)
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers = []
    while True:
        raw = reader.readline(65537)
        if raw in (b"\r\n", b"\n", b""):
            break
        key, _, value = raw.decode("latin-1").partition(":")
        headers.append((key.strip(), value.strip()))
    lookup = {k.lower(): v for k, v in headers}
    if lookup.get("expect", "").lower() == "100-continue" and client is not None:
        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        headers = [(k, v) for k, v in headers if k.lower() != "expect"]
    body = b""
    if "content-length" in lookup:
        body = reader.read(int(lookup["content-length"]))
    elif lookup.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int(reader.readline().split(b";")[0], 16)
            if size == 0:
                reader.readline()
                break
            parts.append(reader.read(size))
            reader.readline()
        body = b"".join(parts)
        headers = [(k, v) for k, v in headers if k.lower() != "transfer-encoding"] + [("Content-Length",
                                                                                         str(len(body)))]
    return method, target, headers, body


if __name__ == "__main__":  # ProxyProcess: serve until terminated, the endpoint on the first line of stdout
    import sys
    proxy = FaultProxy(sys.argv[1], int(sys.argv[2]), seed=int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    print(proxy.endpoint, flush=True)
    threading.Event().wait()
