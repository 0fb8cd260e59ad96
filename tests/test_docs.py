"""The docs follow the code: every array and manifest key of each format's schema is written
up in docs/FORMAT.md, and every command has help with an example."""

import re
from pathlib import Path

import pytest

from packtool.formats import packed, tokens
from packtool.pack import entries

DOC_DIR = Path(__file__).resolve().parent.parent / "docs"
DOC = (DOC_DIR / "FORMAT.md").read_text()
# `name` spans outside fenced blocks (whose ``` would pair with the wrong backticks)
QUOTED = set(re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", DOC, flags=re.S)))


@pytest.mark.parametrize("name", sorted({a.name for a in packed.SCHEMA + packed.V1_SCHEMA}))
def test_packed_arrays_documented(name):
    assert f"shard-00000.{name}.npy" in DOC, f"array {name} missing from docs/FORMAT.md"


@pytest.mark.parametrize("key", list(packed.INDEX_KEYS))
def test_index_keys_documented(key):
    assert key in QUOTED, f"index.json key {key!r} missing from docs/FORMAT.md"


@pytest.mark.parametrize("key", [f"{kind}:{k}" for kind, keys in (
    ("shard", entries.SHARD_ENTRY_KEYS), ("group", entries.GROUP_ENTRY_KEYS),
    ("split", entries.SPLIT_KEYS)) for k in keys])
def test_job_entry_keys_documented(key):
    """Every key of a pack job's entry file (.shard-K.entry.json, .group-G.entry.json)."""
    kind, name = key.split(":")
    assert name in QUOTED, f"{kind} entry key {name!r} missing from docs/FORMAT.md"


@pytest.mark.parametrize("suffix", [f.suffix for f in tokens.SCHEMA] + [".json"])
def test_token_files_documented(suffix):
    assert f"`PREFIX{suffix}`" in DOC, f"PREFIX{suffix} missing from docs/FORMAT.md"


@pytest.mark.parametrize("key", list(tokens.MANIFEST_KEYS))
def test_token_manifest_keys_documented(key):
    assert key in QUOTED, f"token manifest key {key!r} missing from docs/FORMAT.md"


def test_writers_refuse_undocumented_keys():
    """A key added to a manifest without a schema entry fails at write time, not silently."""
    with pytest.raises(RuntimeError, match="not in the schema"):
        packed.index({"new_key": 1}, [])
    with pytest.raises(RuntimeError, match="not in the schema"):
        tokens.corpus_manifest({"new_key": 1}, [], {})
    with pytest.raises(RuntimeError, match="not in the schema"):
        entries.group_entry("0" * 64, 0, {"train": {"new_key": 1}})


def test_cli_starts_without_heavy_imports():
    """Issue 9.4: `packtool --help` took ~1 s because building --algo imported every packer.
    Importing the CLI (and running --help) must not load numba, scipy, highspy, pyarrow,
    tokenizers or numpy."""
    import subprocess
    import sys

    code = ("import sys; sys.argv = ['packtool', '--help']\n"
            "from packtool.cli import cli\n"
            "try:\n    cli.main(prog_name='packtool', standalone_mode=False)\n"
            "except SystemExit:\n    pass\n"
            "heavy = ('numba', 'scipy', 'highspy', 'pyarrow', 'tokenizers', 'numpy', 'torch')\n"
            "print(sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == "[]", out


def format_snippet() -> str:
    """The plain-numpy reader of docs/FORMAT.md, as written there."""
    at = DOC.index("Reading either layout with plain numpy")
    start = DOC.index("```python\n", at) + len("```python\n")
    return DOC[start:DOC.index("```", start)]


@pytest.mark.parametrize("layout,vocab", [("index", 500), ("tokens", 500), ("tokens", 40_000)])
def test_format_snippet_reads_a_pack(tmp_path, layout, vocab):
    """docs/FORMAT.md's plain-numpy block reads pack j of shard 0 as open_packed does: a
    source of three parts with a loss mask, one of one part without, both layouts (the
    tokens layout with the mask folded into the id's top bit, and 1 bit a token)."""
    import numpy as np
    from synth import lognormal_lengths, write_token_corpus

    import packtool

    write_token_corpus(tmp_path / "a", lognormal_lengths(300, median=30, cap=200, seed=1),
                       vocab_size=vocab, seed=1, mask=True, parts=3)
    write_token_corpus(tmp_path / "b", lognormal_lengths(200, median=30, cap=200, seed=2),
                       vocab_size=vocab, seed=2)
    out = tmp_path / "packed"
    packtool.pack_corpus([tmp_path / "a", tmp_path / "b"], out, 128, layout=layout)
    ds = packtool.open_packed(out)
    stored = {("index", 500): "source", ("tokens", 500): "folded", ("tokens", 40_000): "bits"}
    assert ds.index["mask_storage"] == stored[layout, vocab]
    assert len(ds.index["sources"]) == 2
    for j in (0, ds.index["shards"][0]["n_packs"] - 1):
        names = {}
        exec(format_snippet().replace('d, j = "out/packed", 0', f"d, j = {str(out)!r}, {j}"),
             names)
        ex = ds[j]
        for key, want in (("tokens", "input_ids"), ("labels", "labels"),
                          ("positions", "position_ids"), ("cu_seqlens", "cu_seqlens")):
            assert np.array_equal(names[key], ex[want]), (layout, key)
        assert (names["labels"] == -100).sum() > len(names["cu_seqlens"]) - 1  # the mask


# -- the README and the links between the docs -------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but ``-`` and ``_`` dropped, spaces to
    ``-`` ("Measured (scripts/bench_scale.py, ...)" -> "measured-scriptsbench_scalepy-...")."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a shell comment is no heading
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_readme_is_short_and_links_the_docs():
    """The README is read in a minute (it was 14.8 kB, the tokenize bullet alone 20 lines):
    what it does, the two commands, the pipeline, five measured rows; the rest is in docs/,
    each doc linked from it, the full measured table in docs/BENCHMARKS.md."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme) <= 9_000, f"README.md is {len(readme):,} characters (at most 9,000)"
    linked = set(LINK.findall(readme))
    top = [p for p in PAGES[1:] if p.parent.name == "docs"]  # docs/training/ via TRAINING.md
    unlinked = [p.name for p in top if f"docs/{p.name}" not in linked]
    assert "docs/BENCHMARKS.md" in linked and not unlinked, unlinked
    measured = readme.split("## Measured", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"^\| (?!---|what \|)", measured, re.M)) <= 5, measured


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    """Every link to a file of the repository names one that is there, and a #section of a
    page one of its headings (a heading renamed or a doc moved breaks no reader's link)."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and anchor not in anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_every_measured_row_has_its_command():
    """docs/BENCHMARKS.md: each figure with the command that measured it, and each script it
    names is in scripts/."""
    rows = [r for r in (ROOT / "docs" / "BENCHMARKS.md").read_text().splitlines()
            if r.startswith("| ") and not r.startswith(("| what |", "| --- |"))]
    assert len(rows) >= 19, len(rows)
    for row in rows:
        command = row.rstrip(" |").rsplit(" | ", 1)[1]
        assert re.match(r"`(python|packtool) ", command), row[:80]
    missing = {s for row in rows for s in re.findall(r"scripts/(\w+\.py)", row)
               if not (ROOT / "scripts" / s).is_file()}
    assert not missing, missing


def test_conflict_table_is_the_one_in_the_docs():
    """docs/PIPELINE.md shows packtool.conflicts' table as it is, row for row."""
    from packtool import conflicts

    page = (DOC_DIR / "PIPELINE.md").read_text()
    assert conflicts.markdown() in page
    rows = [r for r in page.split("## Which options combine")[1].split("\n## ")[0].splitlines()
            if r.startswith("| ") and not r.startswith("| Together")]
    assert len(rows) == len(conflicts.CONFLICTS)


def test_every_packed_version_is_listed_with_its_keys():
    """docs/FORMAT.md's table of packed versions: one row per version, naming the keys that
    make its layout (packtool.formats.packed.schema.VERSION_KEYS)."""
    from packtool.formats.packed.schema import READABLE, VERSION_KEYS

    rows = {int(m.group(1)): m.group(0) for m in re.finditer(r"^\| (\d) \|.*$", DOC, re.M)}
    assert set(rows) == set(READABLE)
    for v, keys in VERSION_KEYS.items():
        assert all(f"`{k}`" in rows[v] for k in keys), (v, rows[v])
