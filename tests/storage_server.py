"""A real S3 server for the storage tests: moto's ``ThreadedMotoServer`` (an HTTP server
speaking the S3 API) on 127.0.0.1 at a free port, with dummy credentials, the way datatrove's
own tests run. Clients are the real s3fs/botocore, configured by ``storage_options`` (in
process) or ``--storage-options`` / ``$PACKTOOL_STORAGE_OPTIONS`` (subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3:
    """A running server: ``options`` for fsspec, ``fs`` an s3fs client, ``bucket()`` a new
    empty bucket, ``env`` what a subprocess needs to reach it."""

    def __init__(self):
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        os.environ.update(CREDENTIALS)
        self.port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.options = {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}
        self.fs = self.client()

    def client(self):
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        return s3fs.S3FileSystem(skip_instance_cache=True, **self.options)

    @property
    def env(self) -> dict:
        return {**os.environ, **CREDENTIALS,
                "PACKTOOL_STORAGE_OPTIONS": json.dumps(self.options)}

    def bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.fs.mkdir(name)
        return name

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        """The same server again, on the same port (what it held is gone: moto keeps state
        in the server process; tests that restart re-create their bucket)."""
        from moto.server import ThreadedMotoServer

        self.server.stop()  # a no-op when stopped: a running one would hold the port
        with socket.socket() as s:  # a port still held would fail the server's thread, and
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # start() would wait on
            s.bind(("127.0.0.1", self.port))  # it for ever: fail here instead
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()


class S3Process(S3):
    """moto's server in a process of its own (``python -m moto.server``), so that a test can
    stop it (SIGSTOP: a store that takes connections and never answers), continue it, or
    kill it."""

    def __init__(self):
        os.environ.update(CREDENTIALS)
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.1)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.options = {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}
        self.fs = self.client()

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        raise NotImplementedError("a process server is started once; use S3 to restart")
