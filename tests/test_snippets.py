"""Issue 18.6 and 38.7: every snippet in README.md and docs/ (its pages under docs/training/
too) runs as written.

The README's pipeline (its ``packtool ...`` lines) runs first, in a temporary folder laid
out as it assumes: ``data/`` and ``more/*.jsonl.zst`` (110 records of the bundled corpus,
~22,000 tokens: 6 packs of 4,096, so that the training loops below take one step), and
``path/to/model`` (the bundled tokenizer, with the README's ``--eos '</s>'`` added as a
special token); then docs/EXPORT.md's ``packtool export`` lines, then the setup commands that
docs/TRAINING.md and each page of docs/training/ show above their first snippet (the bundled
``fixtures/`` tokenized and packed into ``out/fixture/``; a command shown on several pages runs
once). That leaves what the Python snippets read: ``out/corpus``, ``out/packed``,
``out/mega/corpus``, ``out/llmc``, ``out/mds``, ``out/packed.parquet``, ``out/fixture/...``.
Every ```python block then runs in a fresh process in that folder (forked from one that has
imported torch, transformers and packtool, as the commands are: tests/warm.py). (The README's
install block is .ci/run's, not run here.)

A snippet defines what it uses, or uses names its page's first snippet defines (a page is read
from the top: ``model`` and ``ds`` of a training page's opening snippet); that first snippet
then runs before it, in the same process. A name defined nowhere fails at once
(:func:`test_python_snippets_define_what_they_use`), before anything runs. A block is skipped
only when the line before its fence says so with a reason,
``<!-- snippet: skip (needs GPUs ...) -->``; the reason is shown in the test report.
"""
import ast
import builtins
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import CORPUS, ROOT, TOKENIZER
from warm import Warm

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SKIP = re.compile(r"<!--\s*snippet:\s*skip\s*\((.+)\)\s*-->")
FIXTURE_COMMANDS = [ROOT / "README.md", ROOT / "docs" / "EXPORT.md", ROOT / "docs" / "TRAINING.md",
                    *sorted((ROOT / "docs" / "training").glob("*.md"))]  # their packtool lines


@dataclass
class Block:
    path: Path
    line: int            # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None     # the reason, when marked not runnable

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix().removeprefix('docs/')}:{self.line}"


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
        before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        skip = SKIP.search(before)
        out.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1:j]) + "\n",
                         skip.group(1) if skip else None))
        i = j + 1
    return out


def packtool_lines(block: Block) -> list[list[str]]:
    """The ``packtool ...`` commands of a shell block (continuations joined, comments off)."""
    joined = block.code.replace("\\\n", " ")
    cmds = [shlex.split(line, comments=True) for line in joined.splitlines()]
    return [c for c in cmds if c and c[0] == "packtool"]


PYTHON = [b for p in DOCS for b in blocks(p) if b.lang == "python"]
SHELL = [b for p in FIXTURE_COMMANDS for b in blocks(p) if b.lang in ("bash", "sh")]


def names(code: str) -> tuple[set[str], set[str]]:
    """(names the code binds, names it reads)."""
    bound, used = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else used).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound, used


def prelude(block: Block) -> Block | None:
    """The page's first snippet when ``block`` reads a name only that one defines."""
    first = next(b for b in PYTHON if b.path == block.path)
    if first is block:
        return None
    bound, used = names(block.code)
    free = used - bound - set(dir(builtins))
    return first if free & names(first.code)[0] else None


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1",
            "HF_HOME": "hf-home", "MPLBACKEND": "Agg"}


def _layout(w: Path) -> None:
    import zstandard
    from tokenizers import AddedToken, Tokenizer

    (w / "data").mkdir()
    (w / "more").mkdir()
    lines = (CORPUS / "part-0.jsonl").read_bytes().splitlines(keepends=True)
    (w / "data" / "web.jsonl").write_bytes(b"".join(lines[:80]))
    (w / "more" / "books.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(b"".join(lines[80:110])))
    tok = Tokenizer.from_file(str(TOKENIZER))
    tok.add_special_tokens([AddedToken("</s>", special=True)])
    (w / "path" / "to" / "model").mkdir(parents=True)
    tok.save(str(w / "path" / "to" / "model" / "tokenizer.json"))


# what most snippets and commands import, imported once: each then runs in a process forked
# from that interpreter (tests/warm.py), with its own namespace, in the folder and the
# environment a fresh `python` would have had (torch and transformers cost ~5 s of CPU a
# process: the file's CPU 245 s -> 115 s, single-process on a loaded machine)
PRELOAD = ["numpy", "pyarrow", "numba", "torch", "transformers",
           "transformers.models.llama.modeling_llama", "packtool", "packtool.cli"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The folder after the README's pipeline and EXPORT.md's exports; each command's
    (block, argv, returncode, stderr); and the warm interpreter the commands and snippets
    are forked from."""
    w = tmp_path_factory.mktemp("snippets")
    _layout(w)
    (w / "fixtures").symlink_to(ROOT / "fixtures")  # the training pages' commands read it
    warm = Warm(w, _env(), PRELOAD, tmp_path_factory.mktemp("warm"))
    ran, seen = [], set()
    for block in SHELL:
        for argv in packtool_lines(block):
            if tuple(argv) in seen:  # the same setup shown on several pages
                continue
            seen.add(tuple(argv))
            r = warm.run(["-m", "packtool", *argv[1:]], timeout=600)
            ran.append((block.id, argv, r.returncode, r.stderr))
    yield w, ran, warm
    warm.close()


@pytest.mark.slow  # 19 commands, each a fresh process (stats --algos all --plot; the mds
# exports import torch): ~20 s on 2 cores
def test_the_readme_pipeline_and_the_export_commands_run(workspace):
    w, ran, _ = workspace
    commands = [(where.split(":")[0], argv[1]) for where, argv, _, _ in ran]
    assert commands[:5] == [("README.md", c) for c in ("tokenize", "pack", "verify", "stats",
                                                        "export")], commands
    exports = {c for where, c in commands if where == "EXPORT.md"}
    setups = {where for where, c in commands if where.startswith(("TRAINING.md", "training/"))}
    assert exports == {"export"} and {"TRAINING.md", "training/preference.md"} <= setups, commands
    failed = [f"{where}: {' '.join(argv)} -> {rc}: {err[-600:]}"
              for where, argv, rc, err in ran if rc != 0]
    assert not failed, "\n".join(failed)
    assert (w / "lengths.png").stat().st_size > 0  # the README's stats --plot


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in PYTHON if not b.skip])
def test_python_snippets_define_what_they_use(block):
    """A name a snippet reads is its own, Python's, or its page's first snippet's: a reader who
    copies the page from the top has it (TRAINING.md's snippets once used a ``model`` that no
    page defined)."""
    bound, used = names(block.code)
    first = prelude(block)
    known = bound | set(dir(builtins)) | (names(first.code)[0] if first else set())
    assert not used - known, f"{block.id} uses {sorted(used - known)}, defined nowhere before it"


def test_skips_are_few_and_say_why():
    skipped = [b for b in PYTHON if b.skip]
    assert len(skipped) <= 4, [b.id for b in skipped]  # torchrun, Megatron-Bridge, verl, TRL
    assert all(len(b.skip) > 20 for b in skipped)


@pytest.mark.slow  # the workspace's commands alone take ~11 s on 2 cores
@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in PYTHON])
def test_python_snippet_runs(block, workspace, tmp_path):
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    w, _, warm = workspace
    first = prelude(block)
    code = block.code if first is None else first.code + block.code
    script = tmp_path / "snippet.py"
    script.write_text(code)
    r = warm.run([script], timeout=600)
    assert r.returncode == 0, f"{block.id} failed:\n{r.stderr[-3000:]}"
