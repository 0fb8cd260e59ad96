"""The docs follow the code: every array and manifest key of each format's schema is written
up in docs/FORMAT.md, and every command has help with an example."""

import re
from pathlib import Path

import pytest

from packtool.formats import packed, tokens

DOC = (Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md").read_text()
# `name` spans outside fenced blocks (whose ``` would pair with the wrong backticks)
QUOTED = set(re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", DOC, flags=re.S)))


@pytest.mark.parametrize("name", sorted({a.name for a in packed.SCHEMA + packed.V1_SCHEMA}))
def test_packed_arrays_documented(name):
    assert f"shard-00000.{name}.npy" in DOC, f"array {name} missing from docs/FORMAT.md"


@pytest.mark.parametrize("key", list(packed.INDEX_KEYS))
def test_index_keys_documented(key):
    assert key in QUOTED, f"index.json key {key!r} missing from docs/FORMAT.md"


@pytest.mark.parametrize("key", [f"{kind}:{k}" for kind, keys in (
    ("shard", packed.entries.SHARD_ENTRY_KEYS), ("group", packed.entries.GROUP_ENTRY_KEYS),
    ("split", packed.entries.SPLIT_KEYS)) for k in keys])
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
        packed.entries.group_entry("0" * 64, 0, {"train": {"new_key": 1}})


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
