"""Attack packtool with bad inputs, hostile files and edge cases; count the outcomes.

    python scripts/probe_inputs.py [--root CHECKOUT] [--module packtool] [--before OLD]
                                   [--only REGEX] [--jobs 2] [--save results.json]

The probes (scripts/probes/*.py, one module per concern of issue 18: inputs, data loss,
integrity and security, mixtures and the sampler, tokenizers, manifests, scale, messages)
are data: a command, the files it is given, and what must happen. Each runs in a folder of
its own with a fresh process of the packtool of ``--root`` (``python -m MODULE``; an older
checkout: ``git worktree add /tmp/probe-before 48517bf`` then ``--before /tmp/probe-before``
to measure both and print the before/after table). A probe passes when the run exits
non-zero with an ``Error:`` line, no traceback, leaves nothing behind and finishes within its
timeout, and nothing that was there before changed; a positive probe (``--overwrite`` must
keep a user's file, a glob must read an export) passes when it works and its check holds.
The outcomes are defined in scripts/probes/__init__.py. Prints one line per probe that did
not pass and the table; exits 1 if any probe did not pass on ``--root``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probes import (  # noqa: E402  # noqa: E402
    OUTCOMES,
    PASSES,
    Ctx,
    data_loss,
    fixtures,
    inputs,
    integrity,
    manifests,
    messages,
    mixtures,
    run_probe,
    scale,
    tokenizers,
)

MODULES = (inputs, data_loss, integrity, mixtures, tokenizers, manifests, scale, messages)
COLUMNS = ("clear error", "ok", "traceback", "silently accepted", "wrong data", "files left",
           "hang", "unclear error", "refused", "unsupported")


def all_probes(ctx: Ctx) -> list:
    probes = [p for m in MODULES for p in m.probes(ctx)]
    names = [p.name for p in probes]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit(f"probe names must be unique: {sorted(dup)}")
    return probes


def campaign(root: Path, module: str, work: Path, only: str | None, jobs: int,
             log=print) -> list[dict]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ctx = Ctx(root, module, work, work / "fixtures", root / "fixtures" / "tokenizer")
    log(f"{root}: making fixtures")
    fixtures.build(ctx, log)
    probes = [p for p in all_probes(ctx) if not only or re.search(only, p.name)]
    log(f"{root}: {len(probes)} probes")

    def one(item):
        i, p = item
        outcome, detail = run_probe(ctx, p, work / "cases" / f"{i:03d}")
        if outcome not in PASSES:
            log(f"  {outcome:17} [{p.section}] {p.name}: {detail}")
        return {"name": p.name, "section": p.section, "expect": p.expect,
                "outcome": outcome, "detail": detail}

    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, enumerate(probes)))


def table(runs: dict[str, list[dict]]) -> str:
    """Markdown: one row per version, one column per outcome."""
    head = ["version", "probes", "passed", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for label, rows in runs.items():
        counts = [sum(r["outcome"] == c for r in rows) for c in COLUMNS]
        passed = sum(r["outcome"] in PASSES for r in rows)
        lines.append("| " + " | ".join(map(str, [label, len(rows), passed, *counts])) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to probe")
    ap.add_argument("--module", default="packtool")
    ap.add_argument("--before", type=Path, default=None,
                    help="an older checkout to probe too (the before/after table)")
    ap.add_argument("--before-module", default="packtool")
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench-out" / "probe")
    ap.add_argument("--only", default=None, help="only probes whose name matches")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--save", type=Path, default=None, help="write every outcome as JSON")
    a = ap.parse_args()
    runs = {}
    if a.before is not None:
        runs[f"before ({a.before.name})"] = campaign(
            a.before.resolve(), a.before_module, a.workdir.resolve() / "before", a.only, a.jobs)
    runs["this tree"] = campaign(a.root.resolve(), a.module, a.workdir.resolve() / "now",
                                 a.only, a.jobs)
    assert set(COLUMNS) == set(OUTCOMES)
    print(table(runs))
    if a.save:
        a.save.write_text(json.dumps(runs, indent=1))
    sys.exit(0 if all(r["outcome"] in PASSES for r in runs["this tree"]) else 1)


if __name__ == "__main__":
    main()
