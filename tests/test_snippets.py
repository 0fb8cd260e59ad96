"""Issue 18.6: every snippet in README.md and docs/*.md runs as written.

The README's pipeline (its ``packtool ...`` lines) runs first, in a temporary folder laid
out as it assumes: ``data/`` and ``more/*.jsonl.zst`` (110 records of the bundled corpus,
~22,000 tokens: 6 packs of 4,096, so that the training loops below take one step), and
``path/to/model`` (the bundled tokenizer, with the README's ``--eos '</s>'`` added as a
special token); then docs/EXPORT.md's ``packtool export`` lines. That leaves what the
Python snippets read: ``out/corpus``, ``out/packed``, ``out/mega/corpus``, ``out/llmc``,
``out/mds``, ``out/packed.parquet``. Every ```python block then runs in a fresh process in
that folder. (The README's install block is .ci/run's, not run here.)

A snippet may use names the reader brings, and only these (:data:`READER`): ``model``, a
causal language model (here a one-layer Llama of width 32). A block is skipped only when the
line before its fence says so with a reason, ``<!-- snippet: skip (needs GPUs ...) -->``;
the reason is shown in the test report.
"""

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import CORPUS, ROOT, TOKENIZER

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"<!--\s*snippet:\s*skip\s*\((.+)\)\s*-->")
READER = {"model": """
import transformers as _t
model = _t.LlamaForCausalLM(_t.LlamaConfig(
    vocab_size=2112, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=8192))
"""}
FIXTURE_COMMANDS = [ROOT / "README.md", ROOT / "docs" / "EXPORT.md"]  # their packtool lines


@dataclass
class Block:
    path: Path
    line: int            # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None     # the reason, when marked not runnable

    @property
    def id(self) -> str:
        return f"{self.path.name}:{self.line}"


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


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The folder after the README's pipeline and EXPORT.md's exports; each command's
    (block, argv, returncode, stderr)."""
    w = tmp_path_factory.mktemp("snippets")
    _layout(w)
    ran = []
    for block in SHELL:
        for argv in packtool_lines(block):
            r = subprocess.run([sys.executable, "-m", "packtool", *argv[1:]], cwd=w,
                               env=_env(), capture_output=True, text=True, timeout=600)
            ran.append((block.id, argv, r.returncode, r.stderr))
    return w, ran


@pytest.mark.slow  # 11 commands, each a fresh process (stats --algos all --plot; the mds
# export imports torch): ~11 s on 2 cores
def test_the_readme_pipeline_and_the_export_commands_run(workspace):
    w, ran = workspace
    commands = [(where.split(":")[0], argv[1]) for where, argv, _, _ in ran]
    assert commands[:5] == [("README.md", c) for c in ("tokenize", "pack", "verify", "stats",
                                                        "export")], commands
    assert commands[5:] and {c for _, c in commands[5:]} == {"export"}, commands
    failed = [f"{where}: {' '.join(argv)} -> {rc}: {err[-600:]}"
              for where, argv, rc, err in ran if rc != 0]
    assert not failed, "\n".join(failed)
    assert (w / "lengths.png").stat().st_size > 0  # the README's stats --plot


def test_skips_are_few_and_say_why():
    skipped = [b for b in PYTHON if b.skip]
    assert len(skipped) <= 2, [b.id for b in skipped]
    assert all(len(b.skip) > 20 for b in skipped)


@pytest.mark.slow  # the workspace's commands alone take ~11 s on 2 cores
@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in PYTHON])
def test_python_snippet_runs(block, workspace, tmp_path):
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    w, _ = workspace
    code = block.code
    for name, setup in READER.items():
        if re.search(rf"\b{name}\b", code) and not re.search(rf"^{name}\s*=", code, re.M):
            code = setup + code
    script = tmp_path / "snippet.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], cwd=w, env=_env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"{block.id} failed:\n{r.stderr[-3000:]}"
