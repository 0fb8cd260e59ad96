"""A real S3 server for the storage tests: moto's ``ThreadedMotoServer`` (an HTTP server
speaking the S3 API) on 127.0.0.1 at a free port, with dummy credentials, the way datatrove's
own tests run. Clients are the real s3fs/botocore, configured by ``storage_options`` (in
process) or ``--storage-options`` / ``$PACKTOOL_STORAGE_OPTIONS`` (subprocesses)."""

from __future__ import annotations

import json
import os
import socket
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
