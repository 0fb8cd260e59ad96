"""MosaicML Streaming (MDS) shards: one sample per pack, written by ``streaming.MDSWriter``::

    DIR/index.json            MDS's own index (version 2), read by streaming.StreamingDataset
    DIR/shard.00000.mds ...   samples, 64 MB per shard (MDSWriter's default), uncompressed
    DIR/.packtool-export.json what was exported from where (hidden: globs skip it)

    sample columns (MDS encodings)
      input_ids     ndarray:int32   tokens of the pack
      position_ids  ndarray:int32   restart at 0 in every segment
      cu_seqlens    ndarray:int32   [0, end of segment 1, ..., len(input_ids)] (flash-attn varlen);
                                    an aligned dataset's rows hold each segment's pads after it
                                    (pad_id, labels -100) and these are the padded boundaries
      labels        ndarray:int32   -100 at each segment's first token and where loss mask is 0
      loss_mask     ndarray:uint8   only when the packed dataset has one (SFT/chat)
      seq_group     ndarray:int64   pairs and groups only: each segment's group and role (1
      seq_role      ndarray:int32   chosen, 2 rejected, 3 + k completion k); a segment is one
                                    sequence, prompt + completion (--share-prompt is refused)

Read with ``StreamingDataset(local=DIR, shuffle=False)[i]`` (or ``remote=`` after uploading);
for batches, ``StreamingDataLoader(dataset, batch_size=B, collate_fn=packtool.torch.collate_mds)``
(rows are ragged, so the default collate cannot stack them; collate_mds flattens them into one
``[1, N]`` varlen row).

About torchvision: ``import streaming`` imports ``streaming.vision``, which imports
``torchvision`` at module load, although MDS writing and reading never call it. Where
torchvision is absent or broken (the package index's wheel fails against the CPU build of
torch 2.13: "operator torchvision::nms does not exist"), :func:`import_streaming` puts a
stand-in module in its place *only for that import*: the two names streaming.vision binds
(``VisionDataset``, ``to_tensor``) raise if anything calls them. A working torchvision is
always used as it is.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np

from ..errors import PacktoolError

MASK = "loss_mask"

GROUP = 1024  # packs converted per vectorised step


def _torchvision_stand_in() -> None:
    import importlib.machinery

    def unavailable(*args, **kwargs):
        raise RuntimeError("torchvision is not usable in this environment (packtool installed a "
                           "stand-in so that mosaicml-streaming's MDS reader/writer import)")

    class VisionDataset:
        def __init__(self, *args, **kwargs):
            unavailable()

    names = ("torchvision", "torchvision.datasets", "torchvision.transforms",
             "torchvision.transforms.functional")
    mods = {n: types.ModuleType(n) for n in names}
    for n, m in mods.items():
        m.__spec__ = importlib.machinery.ModuleSpec(n, None)  # transformers probes find_spec
        m.__stand_in__ = True
    mods["torchvision"].datasets = mods["torchvision.datasets"]
    mods["torchvision"].transforms = mods["torchvision.transforms"]
    mods["torchvision.transforms"].functional = mods["torchvision.transforms.functional"]
    mods["torchvision.datasets"].VisionDataset = VisionDataset
    mods["torchvision.transforms.functional"].to_tensor = unavailable
    sys.modules.update(mods)


def import_streaming():
    """``import streaming``, standing in for a missing or broken torchvision (see above)."""
    if "streaming" not in sys.modules:
        try:
            import torchvision  # noqa: F401
        except ImportError:
            _torchvision_stand_in()
        except RuntimeError as e:  # torchvision built for another torch
            if "torchvision::" not in str(e):
                raise
            for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
                del sys.modules[name]
            _torchvision_stand_in()
    try:
        import streaming
    except ImportError as e:
        raise PacktoolError(
            f"--format mds needs mosaicml-streaming ({e}): pip install 'packtool[mds]' && pip "
            "install --no-deps mosaicml-streaming==0.13.0 (it pins transformers<5 and "
            "numpy<2.2, which MDS does not need: docs/EXPORT.md)"
        ) from None
    finally:
        _stand_in_gone()
    return streaming


def _stand_in_gone() -> None:
    """streaming keeps the two names it took; later imports see torchvision as it is. Left in
    place, the stand-in made transformers (imported by streaming, its availability probes
    cached) take torchvision for installed, and its image processors then failed importing
    ``InterpolationMode`` from it in the same process."""
    stood_in = [n for n, m in sys.modules.items() if getattr(m, "__stand_in__", False)]
    for name in stood_in:
        del sys.modules[name]
    probes = sys.modules.get("transformers.utils.import_utils")
    if stood_in and probes is not None:
        for probe in (getattr(probes, n) for n in dir(probes) if n.startswith("is_")):
            if hasattr(probe, "cache_clear"):
                probe.cache_clear()


def columns(has_mask: bool, grouped: bool = False) -> dict[str, str]:
    cols = {"input_ids": "ndarray:int32", "position_ids": "ndarray:int32",
            "cu_seqlens": "ndarray:int32", "labels": "ndarray:int32"}
    if has_mask:
        cols[MASK] = "ndarray:uint8"
    if grouped:
        cols.update({"seq_group": "ndarray:int64", "seq_role": "ndarray:int32"})
    return cols


def _samples(ds, k: int, lo: int, hi: int, has_mask: bool):
    """Packs lo..hi-1 of shard k as MDS samples, converted in one step for the group."""
    r = ds.read_range(k, lo, hi, pads=True)
    tokens, positions = r["ids"].astype(np.int32), r["positions"].astype(np.int32)
    labels = r["labels"].astype(np.int32)
    starts = r["seg_start"].astype(np.int32)
    po, ps = r["pack_tok"], r["pack_seg"]
    for j in range(hi - lo):
        a, b = int(po[j]), int(po[j + 1])
        cu = np.append(starts[ps[j]:ps[j + 1]], np.int32(b - a))
        sample = {"input_ids": tokens[a:b], "position_ids": positions[a:b], "cu_seqlens": cu,
                  "labels": labels[a:b]}
        if has_mask:
            mask = r["mask"]
            sample[MASK] = (np.ones(b - a, np.uint8) if mask is None
                            else np.asarray(mask[a:b], np.uint8))
        if "seg_group" in r:  # pairs and groups, plain layout: one segment a sequence
            sample["seq_group"] = r["seg_group"][ps[j]:ps[j + 1]]
            sample["seq_role"] = r["seg_role"][ps[j]:ps[j + 1]]
        yield sample


def export_packed(ds, out: Path, *, tick, **_) -> dict:
    """A packed dataset as MDS shards: one sample per pack."""
    from .marker import write_marker

    if not len(ds):
        raise PacktoolError(f"{ds.directory} holds no packs; nothing to export")
    streaming = import_streaming()
    has_mask = bool(ds.index.get("loss_mask"))
    cols = columns(has_mask, ds.index.get("groups") is not None)
    out = Path(out)
    out.mkdir()
    with streaming.MDSWriter(out=str(out), columns=cols, compression=None) as w:
        for k, sh in enumerate(ds.index["shards"]):
            n = int(sh["n_packs"])
            for lo in range(0, n, GROUP):
                hi = min(n, lo + GROUP)
                for sample in _samples(ds, k, lo, hi, has_mask):
                    w.write(sample)
                po = ds.shard(k).po
                tick(int(po[hi]) - int(po[lo]))
    names = sorted(p.name for p in out.iterdir())
    write_marker(out, "mds", ds, names, n_packs=len(ds), columns=cols,
                 streaming_version=getattr(streaming, "__version__", "?"))
    size = sum(p.stat().st_size for p in out.iterdir())
    return {"files": [out / n for n in names], "bytes_written": size, "notes": [],
            "details": {"columns": cols, "n_mds_shards": sum(n.endswith(".mds") for n in names)}}
