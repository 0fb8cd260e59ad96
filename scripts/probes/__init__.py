"""The probe campaign's machinery: a probe is data (:class:`Probe`), run in a folder of its
own (:class:`Case`) by a fresh process of the packtool under test, and given one outcome.

Outcomes, the first that applies:

- ``hang``: it ran past its timeout (killed);
- ``wrong data``: a file that was there before the run changed or vanished (a user's file
  deleted, a symlink's target overwritten), or the probe's check found the result wrong
  (a corrupted export committed, a resume that kept stale tokens), or the run was accepted
  where acceptance itself means wrong data (``on_accept``: a sampler state that repeats
  batches);
- ``traceback``: a Python traceback on stderr, or a death by signal (the kernel's, out of
  memory): a crash either way;
- ``unsupported``: this version has no such option or command (a usage error naming it), or
  a fixture the probe needs could not be made with it: the probe says nothing about it;
- for probes that must be refused: ``silently accepted`` (exit 0), ``unclear error`` (no
  ``Error:`` line, or a message without what ``want`` asks for), ``files left`` (anything new
  in the probe's folder), else ``clear error`` (a pass);
- for positive probes (``expect="ok"``): ``refused`` (non-zero exit), ``unclear error`` (the
  check of what is printed failed), else ``ok`` (a pass); a ``"safe"`` probe passes refused
  cleanly or done, as long as nothing was harmed (a lock that is a symlink: either is fine,
  following it is not).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

OUTCOMES = ("clear error", "ok", "traceback", "silently accepted", "wrong data", "files left",
            "hang", "unclear error", "refused", "unsupported")
PASSES = ("clear error", "ok")
USAGE = re.compile(r"No such option|No such command|Got unexpected extra argument")
MISSING_API = re.compile(r"^(ImportError: cannot import name|ModuleNotFoundError: No module "
                         r"named 'packtool)")

# run the code of a python probe; a PacktoolError is the CLI's clean error, anything else
# a traceback, as the CLI would show it
WRAP = """import sys
from packtool.errors import PacktoolError
try:
    exec(compile(sys.argv[1], "<probe>", "exec"), {"__name__": "__probe__"})
except PacktoolError as e:
    print(f"Error: {e}", file=sys.stderr)
    sys.exit(1)
"""


@dataclass
class Probe:
    name: str
    section: str                         # the issue 18 section it covers: "2.1", "4", ...
    cmd: list                            # CLI arguments, or ["python", CODE]
    setup: Callable | None = None        # setup(case): make the inputs in case.dir
    before: list = field(default_factory=list)   # commands run first (their refusal counts)
    prepare: Callable | None = None      # prepare(case) after `before`, before the command
    expect: str = "error"                # "error": must be refused; "ok": must work; "safe":
    #                                      either, as long as nothing is harmed
    want: str | None = None              # regex an error message must match to be clear
    check: Callable | None = None        # check(case, stdout, stderr) -> problem or None
    check_kind: str = "wrong data"       # the outcome of a failed check
    on_accept: str = "silently accepted"
    mutable: tuple = ()                  # globs (relative) a positive probe may change
    timeout: float = 120
    shell: str = ""                      # e.g. "ulimit -n 256;" before the command
    needs: tuple = ()                    # fixtures it copies in (Case.use)


@dataclass
class Ctx:
    root: Path          # the checkout under test
    module: str         # python -m MODULE
    work: Path          # this run's folder
    fixtures: Path      # shared inputs, made once by the version under test
    tok: Path           # the bundled tokenizer folder
    missing: dict = field(default_factory=dict)   # fixture -> why it could not be made
    help: dict = field(default_factory=dict)      # command -> its --help text

    def env(self) -> dict:
        return {**os.environ, "PYTHONPATH": f"{self.root}{os.pathsep}{self.root / 'tests'}",
                "HF_DATASETS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false"}

    def argv(self, cmd: list) -> list[str]:
        if cmd and cmd[0] == "python":
            return [sys.executable, "-c", WRAP, *map(str, cmd[1:])]
        return [sys.executable, "-m", self.module, *map(str, cmd)]

    def supports(self, command: str, option: str) -> bool:
        if command not in self.help:
            r = subprocess.run(self.argv([command, "--help"]), capture_output=True, text=True,
                               env=self.env(), cwd=self.root)
            self.help[command] = r.stdout if r.returncode == 0 else ""
        return option in self.help[command]


class Case:
    """A probe's own folder; ``use`` copies shared fixtures into it."""

    def __init__(self, ctx: Ctx, d: Path):
        self.ctx, self.dir = ctx, d

    def use(self, *names: str) -> None:
        for name in names:
            if name in self.ctx.missing:
                raise Unsupported(f"fixture {name}: {self.ctx.missing[name]}")
            src = self.ctx.fixtures / name
            for p in src.iterdir():
                dst = self.dir / p.name
                if p.is_dir() and not p.is_symlink():
                    shutil.copytree(p, dst, symlinks=True, dirs_exist_ok=True)
                else:
                    shutil.copy2(p, dst, follow_symlinks=False)

    def write(self, name: str, data) -> Path:
        p = self.dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        return p

    def json(self, name: str) -> dict:
        return json.loads((self.dir / name).read_text())


class Unsupported(Exception):
    """The probe cannot be set up on this version."""


# ----------------------------------------------------------------- editing helpers
def digest(body: dict, key: str) -> str:
    rest = {k: v for k, v in body.items() if k != key}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def save_json(path: Path, body: dict) -> None:
    """Write a manifest with its own digest recomputed (whichever of packtool's it has)."""
    for key in ("index_sha256", "manifest_sha256", "marker_sha256"):
        if key in body:
            body[key] = digest(body, key)
    path.write_text(json.dumps(body, indent=1))


def edit_json(path: Path, fn: Callable[[dict], None]) -> None:
    body = json.loads(path.read_text())
    fn(body)
    save_json(path, body)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def crc32(path: Path) -> str:
    return f"{zlib.crc32(path.read_bytes()):08x}"


def rehash_tokens(prefix: Path) -> None:
    """A token corpus's recorded checksums recomputed from its files (any version)."""
    def fix(body: dict) -> None:
        entries = body.get("parts") or [{"name": prefix.name, "checksums":
                                         body.get("checksums", {})}]
        for q in entries:
            for key, want in q.get("checksums", {}).items():
                f = prefix.parent / f"{q['name']}.{key}"
                if f.exists():
                    want["sha256"], want["bytes"] = sha256(f), f.stat().st_size
    edit_json(Path(f"{prefix}.json"), fix)


def rehash_index(d: Path) -> None:
    """A packed dataset's crc32s and sizes recomputed from its files."""
    def fix(idx: dict) -> None:
        for sh in idx.get("shards", []):
            for f in sh.get("files", {}).values():
                p = d / f["name"]
                if p.is_file():
                    f["crc32"], f["bytes"] = crc32(p), p.stat().st_size
    edit_json(d / "index.json", fix)


def flip(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x10
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------- running and judging
def snapshot(d: Path) -> dict:
    out = {}
    for base, dirs, files in os.walk(d):
        for name in dirs + files:
            p = Path(base) / name
            rel = str(p.relative_to(d))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", hashlib.sha1(p.read_bytes()).hexdigest())
    return out


def run_cmd(ctx: Ctx, cmd: list, cwd: Path, timeout: float, shell: str = ""):
    """(returncode or None on timeout, stdout, stderr, seconds)."""
    argv = ctx.argv(cmd)
    if shell:
        argv = ["bash", "-c", f"{shell} exec {shlex.join(argv)}"]
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, env=ctx.env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace",
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err, time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err, time.perf_counter() - t0


def _refusal(rc, err: str, probe: Probe) -> str:
    """The outcome of a run that exited non-zero (or hung, or crashed)."""
    if rc is None:
        return "hang"
    if rc < 0 or rc == 137:  # killed by a signal (the kernel's, out of memory): a crash
        return "traceback"
    if MISSING_API.search(_last(err)):
        return "unsupported"
    if "Traceback (most recent call last)" in err:
        return "traceback"
    if rc == 2 and USAGE.search(err):
        return "unsupported"
    if not re.search(r"^Error: ", err, re.M):
        return "unclear error"
    return ""


def judge(ctx: Ctx, probe: Probe, case: Case) -> tuple[str, str]:
    """(outcome, detail) of one probe."""
    t0 = snapshot(case.dir)
    for cmd in probe.before:  # made as a user would, without the probe's `shell` limits
        rc, out, err, _ = run_cmd(ctx, cmd, case.dir, probe.timeout)
        if rc != 0:
            bad = _refusal(rc, err, probe)
            if bad or probe.expect == "ok":
                return bad or "refused", f"(before: {' '.join(map(str, cmd[:3]))}) " \
                    + _last(err)
            return _refused_cleanly(probe, case, t0, err)
    if probe.prepare:
        probe.prepare(case)
    t1 = snapshot(case.dir)
    rc, out, err, secs = run_cmd(ctx, probe.cmd, case.dir, probe.timeout, probe.shell)
    harm = _harm(t1, snapshot(case.dir), probe)
    if rc is None:
        return "hang", f"killed after {secs:.0f} s"
    if harm:
        return "wrong data", harm
    problem = probe.check(case, out, err) if probe.check and (
        rc == 0 or probe.expect == "safe") else None
    if problem and probe.check_kind == "wrong data":
        return "wrong data", problem
    if rc != 0:
        bad = _refusal(rc, err, probe)
        if bad:
            return bad, _last(err)
        if probe.expect == "ok":
            return "refused", _last(err)
        return _refused_cleanly(probe, case, t1, err)
    if probe.expect in ("ok", "safe"):
        return (probe.check_kind, problem) if problem else ("ok", f"{secs:.1f} s")
    return probe.on_accept, "exit 0: " + _last(err or out)


def _refused_cleanly(probe: Probe, case: Case, before: dict, err: str) -> tuple[str, str]:
    now = snapshot(case.dir)
    new = sorted(set(now) - set(before))
    if new:
        return "files left", ", ".join(new[:4])
    if probe.want and not re.search(probe.want, err, re.S):
        return "unclear error", f"message lacks /{probe.want}/: " + _last(err)
    return "clear error", _last(err)


def _harm(before: dict, after: dict, probe: Probe) -> str:
    lost = [k for k in before if k not in after
            and not any(fnmatch.fnmatch(k, g) for g in probe.mutable)]
    changed = [k for k in before if k in after and after[k] != before[k]
               and before[k][0] != "dir" and not any(fnmatch.fnmatch(k, g)
                                                     for g in probe.mutable)]
    if lost or changed:
        return "; ".join(x for x in (f"removed {', '.join(lost[:4])}" if lost else "",
                                     f"changed {', '.join(changed[:4])}" if changed else "")
                         if x)
    return ""


def _last(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:160] if lines else ""


def run_probe(ctx: Ctx, probe: Probe, d: Path) -> tuple[str, str]:
    shutil.rmtree(d, ignore_errors=True)
    (d / "out").mkdir(parents=True)
    case = Case(ctx, d)
    try:
        case.use(*probe.needs)
        if probe.setup:
            probe.setup(case)
    except Unsupported as e:
        return "unsupported", str(e)
    try:
        return judge(ctx, probe, case)
    finally:
        _unlock(d)


def _unlock(d: Path) -> None:
    """Make a probe's folder removable again (a probe may chmod things)."""
    for base, dirs, _ in os.walk(d):
        for name in dirs:
            p = Path(base) / name
            if not p.is_symlink():
                os.chmod(p, 0o755)
