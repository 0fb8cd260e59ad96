"""Kill ``packtool tokenize`` and ``packtool pack`` at random moments and check what is left.

Each trial starts ``python -m packtool tokenize|pack`` (half of them replacing a previous
output with --overwrite; ``pack`` is the index layout, ``pack-tokens`` the tokens layout, where
the checkout has ``--layout``), sends SIGKILL, SIGTERM or SIGINT after a random delay (seeded;
three in four while a clean run was writing its files, one in four anywhere), then checks:

1. no output under its final name unless it is complete and valid (``packtool verify``); after
   SIGTERM/SIGINT the exit code is 143/130 (or 0 if the run had finished) and an interrupted
   run wrote nothing: no new output, a previous one unchanged, no temporary, no lock left;
2. the same command run again (with --overwrite if an output is there) succeeds with no
   manual cleanup, and its output verifies;
3. nothing but the outputs is left in the directory after that re-run.

Usage::

    python scripts/fault_inject.py --kills 20 --seed 0            # this checkout
    python scripts/fault_inject.py --kills 20 --root /tmp/before   # another checkout

prints a table: kills tried / clean per command and signal, and each failure's reason.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}
EXIT = {"SIGTERM": 143, "SIGINT": 130}


def _env(root: Path) -> dict:  # with cwd=root: ``python -m`` imports from the cwd first
    return {**os.environ, "PYTHONPATH": str(root), "PYTHONUNBUFFERED": "1"}


def _cli(root: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "packtool", *args]


def make_inputs(work: Path, root: Path, n_docs: int) -> dict:
    """A JSONL corpus, a tokenized source for pack and a previous output of each command."""
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import make_documents

    tokenizer = root / "fixtures" / "tokenizer" / "tokenizer.json"
    corpus = work / "corpus.jsonl"
    with open(corpus, "w") as f:
        for d in make_documents(n_docs, seed=1, median_words=60, max_words=1500):
            f.write(json.dumps({"text": d}) + "\n")
    src = work / "src"
    src.mkdir()
    _check_run(root, ["tokenize", str(corpus), "-t", str(tokenizer), "-o", str(src / "c"),
                      "-q", "--batch-size", "64"])
    commands = {
        "tokenize": lambda out: ["tokenize", str(corpus), "-t", str(tokenizer), "-o", str(out),
                                 "-q", "--batch-size", "64"],
        "pack": lambda out: ["pack", str(src / "c"), "-L", "512", "--shard-size", "20000",
                             "-o", str(out), "-q"],
    }
    if has_layout(root):
        commands["pack"] = lambda out: ["pack", str(src / "c"), "-L", "512", "--shard-size",
                                        "20000", "-o", str(out), "-q", "--layout", "index"]
        commands["pack-tokens"] = lambda out: ["pack", str(src / "c"), "-L", "512",
                                               "--shard-size", "20000", "-o", str(out), "-q",
                                               "--layout", "tokens"]
    prev = work / "prev"
    prev.mkdir()
    for name, cmd in commands.items():
        _check_run(root, cmd(prev / name))
    return {"commands": commands, "prev": prev}


def has_layout(root: Path) -> bool:
    """Whether the checkout's pack writes two layouts (``--layout index|tokens``)."""
    r = subprocess.run(_cli(root, ["pack", "--help"]), env=_env(root), cwd=root,
                       capture_output=True, text=True)
    return "--layout" in r.stdout


def _check_run(root: Path, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    r = subprocess.run(_cli(root, args), env=_env(root), cwd=root, capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode:
        raise SystemExit(f"setup failed: packtool {' '.join(args)}\n{r.stderr}")
    return r


def _output_files(cmd: str, out: Path) -> list[Path]:
    if cmd.startswith("pack"):
        return [out]
    return [Path(f"{out}{s}") for s in (".bin", ".boundaries", ".mask", ".json")]


def _present(cmd: str, out: Path) -> bool:
    """An output under its final name: the manifest (readers trust only what it names)."""
    return (out / "index.json").exists() if cmd.startswith("pack") else Path(
        f"{out}.json").exists()


def _fingerprint(cmd: str, out: Path) -> str | None:
    h = hashlib.sha256()
    files = sorted(p for p in out.rglob("*") if p.is_file()) if cmd.startswith("pack") else \
        [p for p in _output_files(cmd, out) if p.exists()]
    if not files:
        return None
    for p in files:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _verify(root: Path, out: Path) -> str | None:
    r = subprocess.run(_cli(root, ["verify", str(out)]), env=_env(root), cwd=root,
                       capture_output=True, text=True, timeout=300)
    return None if r.returncode == 0 else f"verify failed: {r.stderr.strip()[-300:]}"


def trial(root: Path, inputs: dict, cmd: str, sig: str, delay: float, overwrite: bool,
          work: Path) -> str | None:
    """One kill; None if everything held, else what went wrong."""
    d = Path(tempfile.mkdtemp(dir=work, prefix=f"{cmd}-{sig}-"))
    out = d / "out"
    if overwrite:
        for p in (inputs["prev"]).iterdir():  # its files and its parts' hidden manifests
            if p.name == cmd or p.name.startswith((cmd + ".", f".{cmd}.")):
                dot = "." if p.name.startswith(".") else ""
                target = d / (dot + "out" + p.name[len(dot + cmd):])
                (shutil.copytree if p.is_dir() else shutil.copy2)(p, target)
    before = _fingerprint(cmd, out)
    args = inputs["commands"][cmd](out) + (["--overwrite"] if overwrite else [])
    proc = subprocess.Popen(_cli(root, args), env=_env(root), cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    if proc.poll() is None:
        proc.send_signal(SIGNALS[sig])
    err = proc.communicate(timeout=300)[1]
    rc = proc.returncode
    if rc == -SIGNALS[sig] and sig != "SIGKILL":
        # the default action, before packtool's first line installed its handlers (Python's
        # own start-up, ~20 ms): the shell shows 128 + signal too; the checks below still hold
        rc = EXIT[sig]
    if (sig == "SIGINT" and rc == 1 and err.rstrip().endswith("KeyboardInterrupt")
            and "packtool" not in err):
        # Ctrl-C inside the interpreter's start-up (importlib, before packtool/__main__.py
        # runs): Python prints its own traceback and exits 1; nothing of packtool ran
        rc = EXIT[sig]
    if sig != "SIGKILL" and rc not in (0, EXIT[sig]):
        return f"exit {rc} after {sig}: {err.strip()[-300:]}"
    if sig != "SIGKILL" and rc == EXIT[sig]:  # an interrupted run writes nothing at all
        # the signal came after the commit; or, for an output of several commits (a
        # tokenize's parts), after one of them: the CLI names what stays and the re-run
        # resumes from it (checked below)
        late = "after the output was complete" in err or "the same command run again " \
            "resumes from them" in err
        if _fingerprint(cmd, out) != before and not late:
            return f"exit {rc} but the output changed: {err.strip()[-200:]}"
        # what a resumed --overwrite needs stays with the finished parts: the list of the
        # old parts it retired (the re-run removes them and it; checked below)
        resumable = (".part.json",) + ((".retired.json",) if late else ())
        extra = sorted(p.name for p in d.iterdir()
                       if p.name.startswith(".") and not p.name.endswith(resumable))
        if extra:
            return f"exit {rc} left {extra}"
    if _present(cmd, out):
        problem = _verify(root, out)
        if problem:
            return "after the kill: " + problem
    # an interrupted --overwrite puts the previous output back: replace it again
    again = inputs["commands"][cmd](out) + (["--overwrite"] if overwrite or _present(cmd, out)
                                            else [])
    r = subprocess.run(_cli(root, again), env=_env(root), cwd=root, capture_output=True, text=True,
                       timeout=600)
    if r.returncode:
        return f"re-run failed (exit {r.returncode}): {r.stderr.strip()[-300:]}"
    problem = _verify(root, out)
    if problem:
        return "after the re-run: " + problem
    left = sorted(p.name for p in d.iterdir()  # parts' own manifests stay (docs/SCALE.md)
                  if p.name.startswith(".") and not p.name.endswith(".part.json"))
    if left:
        return f"left after the re-run: {left}"
    shutil.rmtree(d)
    return None


def clean_run_timing(root: Path, inputs: dict, cmd: str, work: Path) -> tuple[float, float]:
    """(seconds until the first temporary appears, seconds of the whole run) of a clean run:
    most of a run is start-up and planning, its files are written in the last part."""
    d = Path(tempfile.mkdtemp(dir=work, prefix=f"{cmd}-clean-"))
    t0 = time.perf_counter()
    proc = subprocess.Popen(_cli(root, inputs["commands"][cmd](d / "out")), env=_env(root),
                            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = None
    while proc.poll() is None:
        if first is None and any(".tmp-" in p.name for p in d.iterdir()):
            first = time.perf_counter() - t0
        time.sleep(0.005)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"setup failed: {cmd}: {proc.stderr.read().decode()}")
    shutil.rmtree(d)
    return (seconds if first is None else first), seconds


def campaign(root: Path, work: Path, kills: int, seed: int, n_docs: int = 4000,
             commands=None, log=print) -> dict:
    """Run ``kills`` trials per command and signal; {(cmd, sig): [failure or None, ...]}.
    Three kills in four land while the run writes its files (from just before the first
    temporary appears to just after a clean run ends), one in four anywhere in the run."""
    rng = random.Random(seed)
    inputs = make_inputs(work, root, n_docs)
    results = {}
    for cmd in commands or list(inputs["commands"]):
        first, total = clean_run_timing(root, inputs, cmd, work)
        log(f"{cmd}: a clean run takes {total:.2f}s, writing from {first:.2f}s")
        for sig in SIGNALS:
            rows = results[(cmd, sig)] = []
            for i in range(kills):
                lo = 0.0 if rng.random() < 0.25 else 0.9 * first
                delay = rng.uniform(lo, 1.1 * total)
                problem = trial(root, inputs, cmd, sig, delay, overwrite=i % 2 == 1, work=work)
                rows.append(problem)
                if problem:
                    log(f"  {cmd} {sig} at {delay:.2f}s{' --overwrite' if i % 2 else ''}: "
                        f"{problem}")
    return results


def table(results: dict) -> str:
    lines = [f"{'command':11} {'signal':8} {'kills tried':>11} {'clean':>6}"]
    for (cmd, sig), rows in results.items():
        lines.append(f"{cmd:11} {sig:8} {len(rows):>11} {rows.count(None):>6}")
    total = [r for rows in results.values() for r in rows]
    lines.append(f"{'total':20} {len(total):>11} {total.count(None):>6}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20, help="kills per command and signal")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--docs", type=int, default=4000, help="documents in the test corpus")
    ap.add_argument("--root", type=Path, default=ROOT, help="the packtool checkout to test")
    ap.add_argument("--commands", nargs="+", default=None,
                    help="tokenize, pack, pack-tokens (default: all the checkout has)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="packtool-faults-") as work:
        results = campaign(args.root.resolve(), Path(work), args.kills, args.seed, args.docs,
                           args.commands)
    print(table(results))
    sys.exit(0 if all(r is None for rows in results.values() for r in rows) else 1)


if __name__ == "__main__":
    main()
