"""The docs follow the code: every array and manifest key of each format's schema is written
up in docs/FORMAT.md, and every command has help with an example."""

import re
from pathlib import Path

import pytest

from packtool.formats import packed, tokens

DOC = (Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md").read_text()
# `name` spans outside fenced blocks (whose ``` would pair with the wrong backticks)
QUOTED = set(re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", DOC, flags=re.S)))


@pytest.mark.parametrize("name", [a.name for a in packed.SCHEMA])
def test_packed_arrays_documented(name):
    assert f"shard-00000.{name}.npy" in DOC, f"array {name} missing from docs/FORMAT.md"


@pytest.mark.parametrize("key", list(packed.INDEX_KEYS))
def test_index_keys_documented(key):
    assert key in QUOTED, f"index.json key {key!r} missing from docs/FORMAT.md"


@pytest.mark.parametrize("suffix", [f.suffix for f in tokens.SCHEMA] + [".json"])
def test_token_files_documented(suffix):
    assert f"`PREFIX{suffix}`" in DOC, f"PREFIX{suffix} missing from docs/FORMAT.md"


@pytest.mark.parametrize("key", list(tokens.MANIFEST_KEYS))
def test_token_manifest_keys_documented(key):
    assert key in QUOTED, f"token manifest key {key!r} missing from docs/FORMAT.md"


def test_writers_refuse_undocumented_keys(tmp_path):
    """A key added to a manifest without a schema entry fails at write time, not silently."""
    w = packed.PackedWriter(tmp_path, 8, tokens.token_dtype(100), False)
    with pytest.raises(RuntimeError, match="not in the schema"):
        w.finish({"new_key": 1})
