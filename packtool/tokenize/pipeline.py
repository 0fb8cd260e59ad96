"""The tokenize pipeline: every core busy on tokenizing, memory flat, output in input order::

    reader thread                 worker threads (--workers)            calling thread
    files -> records -> batches   tokenizer batch call (GIL released)   in-order: write .bin and
    (bounded queue)          ->   + ids -> numpy                    ->  .boundaries, hash both

Batches are cut by count and by bytes, and at most ``2 * workers`` are in flight, so peak
memory depends on the batch size, not on the corpus. Results are written in input order, so
the output is byte-identical whatever the worker count or batch size. With a fast engine
(``packtool.engines``) the calling thread also picks, in input order, the documents whose ids
checker threads compare with the reference beside the pipeline. Each worker runs the
tokenizer's batch call with the Rust-side thread pool switched off
(``TOKENIZERS_PARALLELISM=false`` during the run): the worker threads are the parallelism.

Every input is stat-ed before and after it is read and hashed (crc32 of its bytes, taken as a
local JSONL file is read, or by reading it again, ~3 GB/s): a file rewritten while it was
being read is an error naming it, and the hash lets a resume trust a finished part only while
its inputs are unchanged.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import numpy as np

from .. import _signals
from ..engines import Sampled, sample_picks
from ..errors import PacktoolError
from ..sources import (
    MEMORY_PER_RECORD_BYTE,
    InputStats,
    content_hash,
    file_kind,
    identity,
    iter_documents,
    utf8_size,
)

_DONE = object()


def _unchanged(path, before: tuple, error: Exception | None = None) -> None:
    """Raise, naming ``path``, if it is not the file it was when reading began."""
    try:
        same = identity(path) == before
    except (OSError, PacktoolError):
        same = False
    if not same:
        raise PacktoolError(
            f"{path} changed while it was being tokenized (its size, modification time, "
            "inode or the store's ETag/version differs from when reading began"
            + (f"; reading it then failed: {error}" if error is not None else "")
            + "); tokenize it again once it is no longer being written") from None


class Reader(threading.Thread):
    """Reads every input in order and queues batches of records, cut by count and bytes:
    ``(records, their UTF-8 sizes, input bytes read so far)``."""

    def __init__(self, paths, read_opts, batch_size, batch_bytes, maxsize, warn_bytes=None):
        super().__init__(daemon=True, name="packtool-reader")
        self.warn_bytes = warn_bytes
        self.paths, self.read_opts = paths, read_opts
        self.batch_size, self.batch_bytes = batch_size, batch_bytes
        self.queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self.stats: list[InputStats] = []
        self.bytes_read = 0
        self.batch, self.sizes, self.nbytes = [], [], 0  # being filled: records, UTF-8 bytes
        self.stop = threading.Event()

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _flush(self) -> bool:
        """Queue the batch being filled; False when the run stopped first."""
        item = (self.batch, self.sizes, self.bytes_read)
        self.batch, self.sizes, self.nbytes = [], [], 0
        return self._put(item)

    def _progress(self, n: int) -> None:
        self.bytes_read += n

    def _warn(self, path, stats: InputStats, size: int) -> None:
        self.warn_bytes = None  # once per run
        unit = "row" if stats.kind in ("parquet", "arrow") else "line"
        print(f"packtool: warning: {path} {unit} {stats.record}: a {size / 1e6:.1f} MB record; "
              f"tokenizing it takes up to about {MEMORY_PER_RECORD_BYTE}x its size in memory "
              f"(~{size * MEMORY_PER_RECORD_BYTE / 1e9:.1f} GB); lower --max-record-bytes to "
              "refuse such records", file=sys.stderr)

    def _read(self, path: Path) -> bool:
        stats = InputStats(path=str(path), kind=file_kind(path))
        self.stats.append(stats)
        before = identity(path)
        try:
            for record in iter_documents(path, self.read_opts, stats, self._progress):
                size = utf8_size(record)
                self.batch.append(record)
                self.sizes.append(size)
                self.nbytes += size
                if self.warn_bytes is not None and size >= self.warn_bytes:
                    self._warn(path, stats, size)
                full = len(self.batch) >= self.batch_size or self.nbytes >= self.batch_bytes
                if full and not self._flush():
                    return False
        except Exception as e:  # a bad record read from a file being rewritten: say that
            _unchanged(path, before, e)
            raise
        try:  # the JSONL reader hashed a local file as it read it; others are read again
            content = stats.content or content_hash(path, before)
        except OSError as e:  # removed or replaced meanwhile
            _unchanged(path, before, e)
            raise
        # after the hash too: the hash must be of the bytes just tokenized, or a resume would
        # trust tokens of the old content under the new content's hash
        _unchanged(path, before)
        stats.content = content
        return True

    def run(self) -> None:
        try:  # every input read and queued, unless the run stopped first
            if all(self._read(path) for path in self.paths) and (not self.batch or self._flush()):
                self._put(_DONE)
        except BaseException as e:  # handed to the consumer, which re-raises it
            self._put(e)


@contextlib.contextmanager
def rust_parallelism_off():
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def _waited(get, empty):
    """``get(timeout=...)``'s result (the reader's next batch, a worker's encoding), waited
    for a tenth of a second at a time with a look at the signals received meanwhile: a
    Ctrl-C whose exception a library swallowed (one raised inside an import can leave that
    module's lock held, so the reader or a worker, importing the same module, never answers:
    a fault-injection run hung 300 s so) still ends the run."""
    while True:
        try:
            return get(timeout=0.1)
        except empty:
            _signals.check()


def run(reader: Reader, encode, writer, engine, workers: int, tick) -> None:
    """Feed ``reader``'s batches to ``workers`` threads running ``encode`` and write their
    results in input order; the sample check's picks are made here, in input order.
    ``tick(n)``: n more input bytes are done."""
    done_bytes = 0
    pool = ThreadPoolExecutor(workers, "packtool-tok")
    try:
        with rust_parallelism_off(), engine.checking(workers):
            reader.start()
            pending: deque = deque()
            done = False
            n_submitted, sampled = 0, Sampled()
            while not done or pending:
                while not done and len(pending) < 2 * workers:
                    item = _waited(reader.queue.get, queue.Empty)
                    if item is _DONE:
                        done = True
                    elif isinstance(item, BaseException):
                        raise item
                    else:
                        records, sizes, bytes_read = item
                        pick = None
                        if engine.check == "sample":
                            pick, sampled = sample_picks(n_submitted, np.array(sizes, np.int64),
                                                         sampled)
                        n_submitted += len(records)
                        pending.append((pool.submit(encode, records, pick), bytes_read))
                if not pending:
                    break
                future, bytes_read = pending.popleft()
                writer.write(*_waited(future.result, FutureTimeout))
                tick(bytes_read - done_bytes)
                done_bytes = bytes_read
    except BaseException:
        reader.stop.set()
        # no waiting for a worker still inside a tokenizer call: the CLI exits without
        # joining it (os._exit), so a runaway batch cannot hold up Ctrl-C or SIGTERM
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    reader.join()
