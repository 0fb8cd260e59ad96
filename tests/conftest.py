import gzip
import json
import os
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
TOKENIZER = FIXTURES / "tokenizer" / "tokenizer.json"
CORPUS = FIXTURES / "corpus"


def packtool_process(*args, env=None, check=True, cwd=ROOT):
    """``python -m packtool ARGS`` in a fresh process from the repository root (or ``cwd``,
    this checkout's packtool imported): its exit code and output (a failure with ``check``,
    and never a traceback). The process is forked from an interpreter that has imported
    numpy, numba and the rest (tests/warm.py): ~1.5 s of CPU less a command."""
    import os

    from warm import python

    if Path(cwd) != ROOT:
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH")] if p)
    r = python(["-m", "packtool", *map(str, args)], cwd=cwd, env=env)
    _RUN_IN_A_CHILD.add("packtool.__main__")  # the tier check's one module run only there
    if check:
        assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r


def slow(*values):
    """Parametrize values that only the full suite runs: ``["a", *slow("b", "c")]`` keeps
    ``a`` in the fast tier (``-m "not slow"``) and marks ``b`` and ``c`` slow."""
    return [pytest.param(v, marks=pytest.mark.slow) for v in values]


def slow_except(values, *fast):
    """``values`` for parametrize, in order, every one but ``fast`` marked slow."""
    return [v if v in fast else pytest.param(v, marks=pytest.mark.slow) for v in values]


def run(*args, catch_exceptions=True):
    """``packtool ARGS`` in this process (click's CliRunner): its result (``exit_code``,
    ``output``). ``catch_exceptions=False`` lets an exception the CLI did not turn into a
    message fail the test with its traceback instead of exit code 1."""
    from click.testing import CliRunner

    from packtool.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=catch_exceptions)


def stop_server_after(s3, n: int, real):
    """An upload function that stops the S3 server before its (n+1)th upload (the fault
    tests of a store that goes down mid-run)."""
    sent = []

    def upload(fs, files, result):
        for local, rpath in files:  # one object at a time, so the server dies between two
            if len(sent) == n:
                s3.stop()
            sent.append(rpath)
            real(fs, [(local, rpath)], result)

    return upload


def server_dies_during_uploads(monkeypatch, tmp_path, s3, module, n: int):
    """A run's cache, storage options of one attempt per request, and ``module.upload``
    stopping the server before its (n+1)th upload; returns the real upload, to put back."""
    import json

    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKTOOL_STORAGE_OPTIONS", json.dumps(
        {**s3.options, "config_kwargs": {"retries": {"max_attempts": 1}}}))
    real = module.upload
    monkeypatch.setattr(module, "upload", stop_server_after(s3, n, real))
    return real


@pytest.fixture(scope="session")
def ray_instance():
    """A local Ray instance of 2 CPUs for the session; its workers import this checkout's
    packtool, and the tests' own modules (stand-in jobs of the fault tests)."""
    import os

    ray = pytest.importorskip("ray")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    workers = os.pathsep.join([os.environ["PYTHONPATH"], str(ROOT / "tests")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": workers}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def s3():
    """A real S3 server for the session (moto's ThreadedMotoServer on 127.0.0.1, a free
    port): see storage_server.py."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from storage_server import S3

    server = S3()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER))


@pytest.fixture(scope="session")
def docs():
    from synth import make_documents

    d = make_documents(60, seed=3, median_words=40, max_words=400)
    d[5] = ""  # an empty record stays a (zero-length) document
    d[9] = "  café 日本語 🚀 naïve\n\nsecond paragraph  "
    return d


def _line(r) -> str:
    line = json.dumps(r, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: keep them as JSON \ud800 escapes
        line = json.dumps(r)
    return line + "\n"


def write_jsonl(path: Path, records, compress=None) -> Path:
    data = "".join(_line(r) for r in records).encode()
    if compress == "gz":
        data = gzip.compress(data)
    elif compress == "zst":
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def encode_all(tokenizer, texts, add_special_tokens=False):
    return [tokenizer.encode(t, add_special_tokens=add_special_tokens).ids for t in texts]


def corpus_docs(prefix):
    import packtool

    c = packtool.open_tokens(prefix)
    return [c[i].tolist() for i in range(len(c))]


# -- the fast tier runs every module ----------------------------------------------------------
# PACKTOOL_TIER_CHECK=1 python -m pytest -m "not slow" fails unless every module of packtool/
# ran in this process during the tests: one of its functions was called, one of its numba
# kernels compiled or loaded, or (a module that defines no function) it was imported. Running
# a module's body on import does not count. coverage is not a dependency, so this is a trace
# of calls only (a callback per Python call, no line events). Children the tests start
# (pool workers, fresh processes) are not traced: what only they run shows as not run, but
# for packtool.__main__, which only ``python -m packtool`` runs (packtool_process notes it).
_TIER_CHECK = os.environ.get("PACKTOOL_TIER_CHECK") == "1"
_CALLED: set[str] = set()  # files whose functions were called
_NOT_RUN = pytest.StashKey[list]()
_RUN_IN_A_CHILD: set[str] = set()  # modules a child process of a test ran: only __main__


def _record_call(frame, event, arg):
    if frame.f_code.co_name != "<module>":
        _CALLED.add(frame.f_code.co_filename)
    # None: no line events for this frame


def pytest_collection_finish(session):
    if _TIER_CHECK:  # from here on: what the tests run, not what collecting them imported
        threading.settrace(_record_call)
        sys.settrace(_record_call)


def _defines_functions(path: Path) -> bool:
    import ast

    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
               for n in ast.walk(ast.parse(path.read_text())))


def _kernel_ran(module) -> bool:
    """A numba kernel of ``module`` was compiled or loaded from the cache (it has a signature)."""
    return any(getattr(v, "signatures", None) and getattr(v, "py_func", None) is not None
               and v.py_func.__module__ == module.__name__ for v in vars(module).values())


def modules_not_run() -> list[str]:
    """The modules of packtool/ that nothing in this process ran (see above)."""
    out = []
    for path in sorted((ROOT / "packtool").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        module = sys.modules.get(name)
        if name in _RUN_IN_A_CHILD:
            continue
        if _defines_functions(path):
            ran = str(path) in _CALLED or (module is not None and _kernel_ran(module))
        else:
            ran = module is not None
        if not ran:
            out.append(name)
    return out


class _WorkersNotRun:
    """Under pytest-xdist (``-n 2``) each worker traces its own share of the tests: each
    sends the modules it did not run, and a module counts as not run only when no worker
    ran it. (The controller runs no test: its own trace is empty.)"""

    def __init__(self):
        self.lists: list[set[str]] = []

    def pytest_testnodedown(self, node, error):
        not_run = getattr(node, "workeroutput", {}).get("packtool_not_run")
        if not_run is not None:
            self.lists.append(set(not_run))


def pytest_configure(config):
    if _TIER_CHECK and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_WorkersNotRun(), "packtool_workers_not_run")


def pytest_sessionfinish(session, exitstatus):
    if not _TIER_CHECK:
        return
    sys.settrace(None)
    threading.settrace(None)
    workers = session.config.pluginmanager.get_plugin("packtool_workers_not_run")
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller decides
        session.config.workeroutput["packtool_not_run"] = modules_not_run()
        return
    if workers is not None and workers.lists:
        missing = sorted(set.intersection(*workers.lists))
    else:
        missing = modules_not_run()
    session.config.stash[_NOT_RUN] = missing
    if missing and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _TIER_CHECK:
        missing = config.stash.get(_NOT_RUN, [])
        terminalreporter.write_line(
            f"PACKTOOL_TIER_CHECK: {len(missing)} module(s) of packtool/ not run: "
            + ", ".join(missing) if missing else
            "PACKTOOL_TIER_CHECK: every module of packtool/ ran")


def launch_ranks(script: Path, args: list, world: int) -> None:
    """Start ``python script *args`` once per rank of a ``torch.distributed`` group of
    ``world`` processes on this machine (RANK, WORLD_SIZE, a free MASTER_PORT) and wait for
    all; a rank that fails fails the test with its output's tail. The ranks are forked from
    an interpreter that has imported torch and transformers (tests/warm.py: ~5 s of CPU less
    a rank), started with OMP_NUM_THREADS=1 as each rank is."""
    import socket

    from warm import ranks

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        procs.append(ranks().start([script, *args], cwd=os.getcwd(), env=env))
    for p in procs:
        r = p.wait(timeout=600)  # a hung collective fails instead of blocking CI
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
