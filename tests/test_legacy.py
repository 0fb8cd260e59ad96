"""Datasets written before token format 3 and packed format 2 stay readable (fixtures/legacy,
made by packtool 0.1.0 at commit 053b53f; its README says how)."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import packtool
from packtool.cli import cli

LEGACY = Path(__file__).resolve().parent.parent / "fixtures" / "legacy"


@pytest.fixture(scope="module")
def legacy(tmp_path_factory):
    d = tmp_path_factory.mktemp("legacy")
    shutil.copytree(LEGACY, d, dirs_exist_ok=True)
    return d


@pytest.mark.parametrize("name", ["packed", "packed-sft"])
def test_version_1_packs_read_as_before(legacy, name):
    expected = np.load(legacy / "expected.npz")
    ds = packtool.open_packed(legacy / name)
    assert ds.version == 1 and len(ds) > 0
    for i in range(len(ds)):
        ex = ds[i]
        for key, value in ex.items():
            want = expected[f"{name}/{i}/{key}"]
            assert np.array_equal(np.asarray(value), want), (name, i, key)
    # the segment tables and costs come from cu_seqlens, without reading tokens
    costs = ds.attention_costs()
    assert costs.shape == (len(ds),)
    assert costs[0] == float((np.diff(ds[0]["cu_seqlens"]).astype(float) ** 2).sum())


def test_version_1_verify_stats_export_sampler(legacy, tmp_path):
    runner = CliRunner()
    for args in (["verify", str(legacy / "packed"), "--source", str(legacy / "corpus")],
                 ["verify", str(legacy / "packed-sft"), "--source", str(legacy / "sft")],
                 ["stats", str(legacy / "packed")],
                 ["export", str(legacy / "packed"), "--format", "parquet", "-o",
                  str(tmp_path / "x.parquet"), "-q"],
                 ["export", str(legacy / "packed-sft"), "--format", "megatron", "-o",
                  str(tmp_path / "m"), "-q"]):
        r = runner.invoke(cli, args)
        assert r.exit_code == 0, (args, r.output)
    from packtool.train.sampler import PackSampler

    ds = packtool.open_packed(legacy / "packed")
    s = PackSampler(ds, rank=0, world_size=2, balance="attention")
    assert sum(len(b) for b in s.steps()) == s.n_steps


@pytest.mark.parametrize("name", ["corpus", "sft"])
def test_version_2_token_corpora_open_verify_and_pack(legacy, tmp_path, name):
    c = packtool.open_tokens(legacy / name)
    assert c.meta["version"] == 2 and len(c.parts) == 2 and len(c) == 60
    c.verify_checksums()
    r = CliRunner().invoke(cli, ["verify", str(legacy / name)])
    assert r.exit_code == 0, r.output
    for layout in ("index", "tokens"):
        out = tmp_path / f"p-{layout}"
        r = CliRunner().invoke(cli, ["pack", str(legacy / name), "-L", "128", "-o", str(out),
                                     "--layout", layout, "-q"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(cli, ["verify", str(out), "--source", str(legacy / name)])
        assert r.exit_code == 0, r.output
    # the new dataset's packs hold the legacy corpus's tokens
    ds = packtool.open_packed(tmp_path / "p-index")
    ex = ds[0]
    for d, o, n, a in zip(ex["source_docs"], ex["source_offsets"], np.diff(ex["cu_seqlens"]),
                          ex["cu_seqlens"][:-1], strict=True):
        assert np.array_equal(ex["input_ids"][a:a + n], c[int(d)][o:o + n])


def test_a_corpus_without_crc32_is_checked_by_sha256(legacy, tmp_path):
    """Token corpora written before manifests recorded crc32 are checked on first read (and
    before pack --layout tokens copies them) by their sha256: a flipped byte is still caught."""
    src = tmp_path / "c"
    shutil.copytree(legacy, src, dirs_exist_ok=True)
    c = packtool.open_tokens(src / "corpus")
    assert all("crc32" not in f for q in c.parts for f in q.entry["checksums"].values())
    data = bytearray((src / "corpus.part-00001.bin").read_bytes())
    data[len(data) // 2] ^= 0x10
    (src / "corpus.part-00001.bin").write_bytes(bytes(data))
    c = packtool.open_tokens(src / "corpus")
    with pytest.raises(packtool.FormatError, match=r"corpus\.part-00001\.bin: sha256"):
        c.parts[1].tokens  # noqa: B018 (the first read checks)
    r = CliRunner().invoke(cli, ["pack", str(src / "corpus"), "-L", "128", "-o",
                                 str(tmp_path / "p"), "--layout", "tokens", "-q"])
    assert r.exit_code == 1 and "corpus.part-00001.bin: sha256" in r.output, r.output
    assert not (tmp_path / "p").exists()
