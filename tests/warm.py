"""Fresh processes without a fresh interpreter's imports: ``python script.py`` and ``python -m
MODULE ARGS``, each in a child forked from one interpreter that has already imported the
heavy libraries (torch and transformers take ~5 s of CPU to import; numpy, numba and
pyarrow with numba's first compilation ~1.5 s: a test file that runs 40 ``python -m
packtool`` commands paid that 40 times).

The child is what ``python`` would have run: a process of its own (its own pid, exit code,
stdout and stderr, stdin from /dev/null, signals as a new process takes them), its script
run as ``__main__`` in a namespace of its own (``__file__``, ``sys.argv``, ``sys.path[0]``
the script's folder; for ``-m`` the working folder), in the working folder and the
environment of the request. Only ``sys.modules`` is shared: a snippet that uses a name it did
not import still fails, and an import that fails in a fresh interpreter fails here. What a
preloaded module read from the environment when it was imported, it read from the server's:
preload only what the children's environments agree on (:func:`shared` preloads third-party
libraries and not packtool, whose modules read ``PACKTOOL_*`` variables when imported).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# The server: preloads the modules named on its command line (then runs numba's first
# compilation, its one-time set-up of ~0.5 s, if numba is among them), then forks one child
# per request line ({"id", "argv", "out", "err", "cwd", "env"}) and answers {"id", "pid"},
# then, once that child has ended, {"id", "rc", "cpu"}; children run side by side.
_SERVER = r"""
import importlib, json, os, select, sys

for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError:  # an optional library: the child imports it, or fails, as a fresh one
        pass
if "numba" in sys.modules:
    sys.modules["numba"].njit(lambda x: x + 1)(1)
answers = os.fdopen(os.dup(1), "w", buffering=1)


def child(req):  # its names local: a -c child empties the module's
    import atexit, os, runpy, sys, traceback
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    if req["cwd"] is not None:
        os.chdir(req["cwd"])
    if req["env"] is not None:
        os.environ.clear()
        os.environ.update(req["env"])
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[1:1] = [os.path.abspath(p) for p in extra if os.path.abspath(p) not in sys.path]
    argv = req["argv"]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            main = sys.modules["__main__"]
            for k in [k for k in vars(main) if k not in ("__builtins__", "__spec__")]:
                delattr(main, k)  # the server's own names: a fresh -c has none
            main.__name__ = "__main__"
            exec(compile(argv[1], "<string>", "exec"), vars(main))
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:  # as an interpreter's exit does: exit handlers, then flushed streams
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


running, pending, reading = {}, b"", True  # one thread: nothing else to fork with
while reading or running:
    ready, _, _ = select.select([0] if reading else [], [], [], 0.01 if running else None)
    if ready:
        data = os.read(0, 1 << 16)
        reading, pending = bool(data), pending + data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                child(req)
            running[pid] = req["id"]
            answers.write(json.dumps({"id": req["id"], "pid": pid}) + "\n")
    while running:
        pid, status, use = os.wait4(-1, os.WNOHANG)
        if not pid:
            break
        answers.write(json.dumps({"id": running.pop(pid), "rc": os.waitstatus_to_exitcode(
            status), "cpu": use.ru_utime + use.ru_stime}) + "\n")
"""


class Warm:
    """A server started in ``cwd`` with ``env`` that has imported ``preload``. ``run(argv,
    cwd=, env=, timeout=)`` is ``subprocess.run([sys.executable, *argv], cwd=cwd, env=env,
    capture_output=True, text=True, timeout=timeout)``, forked from it (the server's folder
    and environment where not given); ``start`` is its ``Popen``."""

    def __init__(self, cwd: Path, env: dict, preload: list[str], scratch: Path | None = None):
        self.own = scratch is None  # a folder of its own, removed on close
        self.scratch = Path(scratch or tempfile.mkdtemp(prefix="warm-"))
        self.n, self.cpu = 0, 0.0  # the children's CPU seconds, added up
        self.answers: dict[int, dict] = {}
        self.changed = threading.Condition()
        self.log = self.scratch / "server.err"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, *preload], cwd=cwd,
                                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, text=True)
        threading.Thread(target=self._read, daemon=True, name="warm-answers").start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.changed:
                self.answers.setdefault(msg["id"], {}).update(msg)
                self.changed.notify_all()
        with self.changed:
            self.answers[-1] = {}  # the server is gone
            self.changed.notify_all()

    def _answer(self, n: int, key: str, timeout: float | None) -> dict | None:
        with self.changed:
            self.changed.wait_for(lambda: key in self.answers.get(n, {}) or -1 in self.answers,
                                  timeout)
            if key in self.answers.get(n, {}):
                return self.answers[n]
            if -1 in self.answers:
                self.proc.wait(60)
                raise RuntimeError(f"the warm interpreter exited ({self.proc.returncode}): "
                                   + self.log.read_text()[-3000:])
            return None

    def start(self, argv: list, cwd=None, env: dict | None = None) -> Child:
        with self.changed:
            self.n += 1
            n = self.n
            out, err = self.scratch / f"{n}.out", self.scratch / f"{n}.err"
            out.touch()  # there even if the child is killed before it opens them
            err.touch()
            self.proc.stdin.write(json.dumps({
                "id": n, "argv": [str(a) for a in argv], "out": str(out), "err": str(err),
                "cwd": None if cwd is None else str(cwd), "env": env}) + "\n")
            self.proc.stdin.flush()
        return Child(self, n, argv, self._answer(n, "pid", None)["pid"], out, err)

    def run(self, argv: list, cwd=None, env: dict | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
        return self.start(argv, cwd, env).wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(60)
        if self.own:
            shutil.rmtree(self.scratch, ignore_errors=True)


class Child:
    """A child of the server, as a ``Popen``: ``pid``, ``send_signal``, ``poll``, and
    ``wait`` (its CompletedProcess; killed and TimeoutExpired past ``timeout``)."""

    def __init__(self, warm: Warm, n: int, argv: list, pid: int, out: Path, err: Path):
        self.warm, self.n, self.argv, self.pid, self.out, self.err = warm, n, argv, pid, out, err
        self.returncode = None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def poll(self) -> int | None:
        done = self.warm._answer(self.n, "rc", 0)
        return None if done is None else done["rc"]

    def wait(self, timeout: float | None = 600) -> subprocess.CompletedProcess:
        done = self.warm._answer(self.n, "rc", timeout)
        if done is None:
            os.kill(self.pid, signal.SIGKILL)
            self.warm._answer(self.n, "rc", None)
        result = subprocess.CompletedProcess(self.argv, self.warm.answers[self.n]["rc"],
                                             self.out.read_text(errors="replace"),
                                             self.err.read_text(errors="replace"))
        if self.returncode is None:
            self.returncode = result.returncode
            self.warm.cpu += self.warm.answers[self.n]["cpu"]
        if done is None:
            raise subprocess.TimeoutExpired(self.argv, timeout, result.stdout, result.stderr)
        return result


# third-party libraries a ``python -m packtool`` command imports (not packtool: see above)
THIRD_PARTY = ["numpy", "numba", "numba.np.arraymath", "pyarrow", "pyarrow.parquet",
               "tokenizers", "click", "zstandard", "fsspec", "s3fs", "botocore.session"]
_SERVERS: dict[str, Warm] = {}


def _server(name: str, env: dict, preload: list[str]) -> Warm:
    if name not in _SERVERS:
        _SERVERS[name] = Warm(Path.cwd(), env, preload)
        atexit.register(_SERVERS[name].close)
    return _SERVERS[name]


def shared() -> Warm:
    """This process's server for ``python -m packtool`` commands, started on first use."""
    return _server("packtool", dict(os.environ), THIRD_PARTY)


def ranks() -> Warm:
    """This process's server for the ranks of a torch.distributed test (``launch_ranks``):
    torch and transformers imported, with OMP_NUM_THREADS=1 (read when torch loads)."""
    return _server("ranks", {**os.environ, "OMP_NUM_THREADS": "1"},
                   ["numpy", "torch", "torch.distributed", "transformers",
                    "transformers.models.llama.modeling_llama"])


class _Subprocess:
    """The ``subprocess`` module, but ``run([sys.executable, ...], capture_output=True,
    text=True)`` forked from :func:`shared` (for a script that calls it: a test sets it as
    the script's ``subprocess``)."""

    def __getattr__(self, name):
        return getattr(subprocess, name)

    def run(self, args, cwd=None, env=None, capture_output=False, text=False, timeout=None,
            **kw):
        if args[0] == sys.executable and capture_output and text and not kw:
            return python(args[1:], cwd=cwd, env=env, timeout=timeout or 3600)
        return subprocess.run(args, cwd=cwd, env=env, capture_output=capture_output,
                              text=text, timeout=timeout, **kw)


SUBPROCESS = _Subprocess()


def python(argv: list, cwd=None, env: dict | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], cwd, env, capture_output=True, text=True,
    timeout)`` forked from :func:`shared`."""
    return shared().run(argv, cwd=os.getcwd() if cwd is None else cwd,
                        env=dict(os.environ) if env is None else env, timeout=timeout)
