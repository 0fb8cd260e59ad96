"""scripts/throttle_proxy.py, the link that scripts/bench_bucket_overlap.py measures
uploads over: it carries bytes unchanged, at its rate each way, and adds its latency once
per one-way trip."""

from __future__ import annotations

import socket
import sys
import threading
import time

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from throttle_proxy import Throttle


def echo_server() -> tuple[socket.socket, int]:
    """A server that sends back whatever it is sent, one connection at a time."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                while data := conn.recv(1 << 16):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def through(proxy: Throttle, payload: bytes) -> tuple[bytes, float]:
    """``payload`` sent through the proxy to the echo server and read back: (what came
    back, seconds)."""
    got = bytearray()
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", proxy.port)) as c:
        sender = threading.Thread(target=c.sendall, args=(payload,))
        sender.start()
        while len(got) < len(payload):
            chunk = c.recv(1 << 16)
            assert chunk, "the proxy closed the connection early"
            got += chunk
        sender.join()
    return bytes(got), time.perf_counter() - t0


def test_the_proxy_limits_the_rate_and_adds_its_latency():
    srv, port = echo_server()
    try:
        payload = bytes(range(256)) * 4096  # 1 MiB
        with Throttle(("127.0.0.1", port), rate=4e6, latency=0.05) as proxy:
            got, secs = through(proxy, payload)
            assert got == payload
            # 1 MiB up, then down, each at 4 MB/s, pipelined: at least 0.26 s for the bytes
            # plus 2 x 50 ms of latency; far below what loopback alone takes
            assert 0.3 < secs < 3.0, secs
            assert proxy.up.bytes == proxy.down.bytes == len(payload)
            _, ping = through(proxy, b"x")
            assert 0.1 <= ping < 1.0, ping  # one round trip: 2 x 50 ms
    finally:
        srv.close()
