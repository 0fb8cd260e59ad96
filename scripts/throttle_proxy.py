"""A TCP proxy that makes loopback look like a network link: bandwidth-limited in each
direction and with a fixed one-way latency, in front of an S3 server (moto) or anything else.

    python scripts/throttle_proxy.py --target 127.0.0.1:5000 [--port 0] [--mbps 100]
                                     [--latency-ms 2]

prints ``listening on 127.0.0.1:PORT`` and forwards every connection there to ``--target``
until Ctrl-C. Tests and benchmarks import it and run it in a thread::

    with Throttle(("127.0.0.1", moto_port), rate=100e6, latency=0.002) as proxy:
        endpoint = f"http://127.0.0.1:{proxy.port}"

Why a proxy: moto on loopback moves an upload at whatever its Python server can parse
(~50-100 MB/s on 2 cores, with bursts far above), so "upload after compute" and "upload
while computing" differ by noise there; a link of known speed makes the transfer's own cost
a number (250 MB at 100 MB/s: 2.5 s) that a run can be compared against.

The model, per direction (client to server, server to client), shared by every connection
as one link is::

    chunk read at t  ->  delivered no earlier than t + latency (a delay line: chunks in
                         flight overlap, so latency costs once per round trip, not per
                         chunk), and no earlier than the link is free: a chunk of n bytes
                         holds the link n / rate seconds (a token bucket with a burst of
                         one chunk, CHUNK = 64 KiB: 0.66 ms at 100 MB/s)

An HTTP request and its answer thus pay 2 x latency (4 ms at the default 2 ms) plus their
bytes at the rate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time

CHUNK = 64 << 10
SLACK = 0.001  # a chunk may leave up to 1 ms early (100 kB at 100 MB/s): the rate holds on
               # average, and the proxy's own cost stays below the link's


class Link:
    """One direction of the link: when it is next free (the token bucket, rate bytes/s)."""

    def __init__(self, rate: float):
        self.rate = rate
        self.free_at = 0.0
        self.bytes = 0

    def reserve(self, n: int, ready: float) -> float:
        """The time the last of ``n`` bytes, ready to go at ``ready``, has left."""
        start = max(ready, self.free_at)
        self.free_at = start + n / self.rate
        self.bytes += n
        return self.free_at


async def _pump(reader, writer, link: Link, latency: float) -> None:
    """Copy ``reader`` to ``writer`` through ``link``: a reading task fills a queue of
    (arrival time, bytes), a sending task delivers each when its latency and the link
    allow; the reader runs ahead at most 64 chunks (4 MiB), like a socket buffer."""
    queue: asyncio.Queue = asyncio.Queue(64)

    async def read():
        try:
            while data := await reader.read(CHUNK):
                await queue.put((time.monotonic(), data))
        except (ConnectionError, OSError):
            pass  # a reset connection ends like a closed one: the sender stops at the mark
        await queue.put((time.monotonic(), b""))

    async def send():
        while True:
            arrived, data = await queue.get()
            if not data:
                return
            due = link.reserve(len(data), arrived + latency)
            delay = due - time.monotonic()
            if delay > SLACK:  # shorter waits are not worth a trip through the event loop:
                await asyncio.sleep(delay)  # the debt carries into the next chunk's due time
            writer.write(data)
            await writer.drain()

    reading = asyncio.ensure_future(read())
    try:
        await send()
    finally:
        reading.cancel()
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()


class Throttle:
    """The proxy, serving on 127.0.0.1:``port`` (0: a free one, then ``self.port``) in a
    thread of its own until ``close()``; ``up`` and ``down`` count the bytes carried each
    way (client to server, and back)."""

    def __init__(self, target: tuple[str, int], rate: float = 100e6, latency: float = 0.002,
                 port: int = 0):
        self.target, self.latency = target, latency
        self.up, self.down = Link(rate), Link(rate)
        self.port = port
        self._tasks: set = set()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="throttle-proxy", daemon=True)

    async def _handle(self, c_reader, c_writer) -> None:
        """One connection: both directions pumped until either side closes (HTTP clients do
        not half-close), then both closed. Its tasks are held in ``_tasks``: asyncio keeps
        only weak references, and a pump waiting on a closed peer was collected mid-wait."""
        try:
            s_reader, s_writer = await asyncio.open_connection(*self.target)
        except OSError:
            c_writer.close()
            return
        pumps = {asyncio.ensure_future(_pump(c_reader, s_writer, self.up, self.latency)),
                 asyncio.ensure_future(_pump(s_reader, c_writer, self.down, self.latency))}
        self._tasks |= pumps
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in pumps:
                t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._tasks -= pumps
            for w in (c_writer, s_writer):
                with contextlib.suppress(Exception):
                    w.close()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    def start(self) -> Throttle:
        self._thread.start()
        self._started.wait()
        return self

    async def _shutdown(self) -> None:
        self._server.close()
        for t in list(self._tasks):  # connections still open (a client's kept-alive ones):
            t.cancel()                 # their pumps end, then their handlers
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.gather(*others, return_exceptions=True)
        await self._server.wait_closed()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Throttle:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    ap.add_argument("--mbps", type=float, default=100.0, help="MB/s (10^6 bytes) each way")
    ap.add_argument("--latency-ms", type=float, default=2.0, help="one-way latency, ms")
    args = ap.parse_args()
    host, _, port = args.target.rpartition(":")
    proxy = Throttle((host or "127.0.0.1", int(port)), args.mbps * 1e6,
                     args.latency_ms / 1000, args.port).start()
    print(f"listening on 127.0.0.1:{proxy.port}, forwarding to {args.target} at "
          f"{args.mbps:g} MB/s and {args.latency_ms:g} ms each way", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        proxy.close()


if __name__ == "__main__":
    main()
