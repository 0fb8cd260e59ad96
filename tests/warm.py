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
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# The server: preloads the modules named on its command line (then runs numba's first
# compilation, its one-time set-up of ~0.5 s, if numba is among them), then forks one child
# per request line ({"argv", "out", "err", "cwd", "env"}) and answers {"pid"}, then {"rc"}.
_SERVER = r"""
import importlib, json, os, sys

for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError:  # an optional library: the child imports it, or fails, as a fresh one
        pass
if "numba" in sys.modules:
    sys.modules["numba"].njit(lambda x: x + 1)(1)
requests, answers = sys.stdin, os.fdopen(os.dup(1), "w", buffering=1)


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


for line in requests:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(req)
    answers.write(json.dumps({"pid": pid}) + "\n")
    _, status, use = os.wait4(pid, 0)
    answers.write(json.dumps({"rc": os.waitstatus_to_exitcode(status),
                              "cpu": use.ru_utime + use.ru_stime}) + "\n")
"""


class Warm:
    """A server started in ``cwd`` with ``env`` that has imported ``preload``. ``run(argv,
    cwd=, env=, timeout=)`` is ``subprocess.run([sys.executable, *argv], cwd=cwd, env=env,
    capture_output=True, text=True, timeout=timeout)``, forked from it (the server's folder
    and environment where not given)."""

    def __init__(self, cwd: Path, env: dict, preload: list[str], scratch: Path | None = None):
        self.scratch = Path(scratch or tempfile.mkdtemp(prefix="warm-"))
        self.n, self.cpu = 0, 0.0  # the children's CPU seconds, added up
        self.lock = threading.Lock()
        self.log = self.scratch / "server.err"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, *preload], cwd=cwd,
                                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, text=True)

    def run(self, argv: list, cwd=None, env: dict | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
        with self.lock:  # one child at a time: the answers come in order
            self.n += 1
            out, err = self.scratch / f"{self.n}.out", self.scratch / f"{self.n}.err"
            self.proc.stdin.write(json.dumps({
                "argv": [str(a) for a in argv], "out": str(out), "err": str(err),
                "cwd": None if cwd is None else str(cwd), "env": env}) + "\n")
            self.proc.stdin.flush()
            pid = json.loads(self._line())["pid"]
            fired = threading.Event()

            def kill():
                fired.set()
                os.kill(pid, signal.SIGKILL)

            timer = threading.Timer(timeout, kill)
            timer.start()
            try:
                done = json.loads(self._line())
                rc, self.cpu = done["rc"], self.cpu + done["cpu"]
            finally:
                timer.cancel()
            result = subprocess.CompletedProcess(
                argv, rc, out.read_text(errors="replace"), err.read_text(errors="replace"))
            out.unlink()
            err.unlink()
        if fired.is_set():
            raise subprocess.TimeoutExpired(argv, timeout, result.stdout, result.stderr)
        return result

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        if not line:  # the server died
            self.proc.wait(60)
            raise RuntimeError(f"the warm interpreter exited ({self.proc.returncode}): "
                               + self.log.read_text()[-3000:])
        return line

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(60)


# third-party libraries a ``python -m packtool`` command imports (not packtool: see above)
THIRD_PARTY = ["numpy", "numba", "numba.np.arraymath", "pyarrow", "pyarrow.parquet",
               "tokenizers", "click", "zstandard", "fsspec", "s3fs", "botocore.session"]
_SHARED: list[Warm] = []


def shared() -> Warm:
    """This process's server for ``python -m packtool`` commands, started on first use."""
    if not _SHARED:
        _SHARED.append(Warm(Path.cwd(), dict(os.environ), THIRD_PARTY))
        atexit.register(_SHARED[0].close)
    return _SHARED[0]


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


def python(argv: list, cwd=None, env: dict | None = None, timeout: float = 600,
           **ignored) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], cwd, env, capture_output=True, text=True,
    timeout)`` forked from :func:`shared`."""
    return shared().run(argv, cwd=os.getcwd() if cwd is None else cwd,
                        env=dict(os.environ) if env is None else env, timeout=timeout)
