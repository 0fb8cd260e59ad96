"""PyTorch / Hugging Face integration (``pip install 'packtool[torch]'``).

    from packtool.torch import PackBatchSampler, TorchPackedDataset, collate_tensors
    ds = TorchPackedDataset("out/packed")
    sampler = PackBatchSampler(ds.packed, rank=rank, world_size=world, batch_size=4,
                               balance="attention")          # see packtool.train.sampler
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=collate_tensors)
    for batch in loader:                 # one [1, N] row: no padding, no cross-attention
        loss = model(**model_inputs(batch), use_cache=False).loss

    Trainer(model=model, train_dataset=ds, data_collator=collate_tensors,
            args=TrainingArguments(..., remove_unused_columns=False))    # the same

What must hold for packed rows to equal the documents alone (tested in
tests/test_equivalence.py for Llama and GPT-2, eager and sdpa attention):

- pass ``position_ids`` (restarting at 0 per segment) and **no** ``attention_mask``:
  transformers then derives the block-diagonal causal mask from the position restarts;
- ``use_cache=False`` (a cache would carry keys across segments);
- flash-attention kernels (``flash_attn_varlen_func``) and models that ignore position ids take
  ``cu_seq_lens_q/k`` and ``max_length_q/k`` instead, which :func:`collate_tensors` also returns;
- the loss is the mean over labels != -100: each segment's first token is -100, so no token
  learns to predict across a boundary.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

try:
    import torch
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("packtool.torch needs PyTorch: pip install 'packtool[torch]'") from e

from .. import conflicts
from ..errors import PacktoolError
from ..formats.packed import open_packed
from ..formats.packed.batching import collate_numpy
from . import sampler as _sampler
from .state import is_state
from .trees import allowed, is_shared, row_tree

MODEL_KEYS = ("input_ids", "labels", "position_ids")
IMAGE_KEYS = ("pixel_values", "image_grid_thw")  # packtool.train.vision's collator adds them


class TorchPackedDataset(torch.utils.data.Dataset):
    """``torch.utils.data.Dataset`` over ``open_packed(directory)``.

    Items are dicts of tensors (input_ids, labels, position_ids int64; doc_ids, cu_seqlens
    int32; max_seqlen int). With ``pad_to`` every item has that length, with
    ``pad_rows=True`` its row's slot length (a --vsl remnant row padded to MIN) (see
    ``PackedReader.get`` in packtool.formats.packed for the pad conventions). ``directory``
    may be a URL (``s3://bucket/packed``): ``storage_options`` for its filesystem,
    ``cache_dir``/``cache_limit`` for the node's cache of its files (ranks of one node share
    it; :mod:`packtool.storage.cache`).
    """

    def __init__(self, directory, pad_to: int | None = None, pad_id: int = 0,
                 pad_multiple: int | None = None, per_segment: bool = False,
                 storage_options: dict | None = None, cache_dir=None,
                 cache_limit: int | None = None, pad_rows: bool = False):
        cache = None
        if cache_dir is not None or cache_limit is not None:
            from ..storage.cache import Cache

            cache = Cache(cache_dir, cache_limit)
        self.packed = open_packed(directory, storage_options=storage_options, cache=cache)
        self.pad_to, self.pad_id = pad_to, pad_id
        self.pad_multiple, self.per_segment = pad_multiple, per_segment
        self.pad_rows = pad_rows

    def __len__(self) -> int:
        return len(self.packed)

    def __getitem__(self, i: int) -> dict:
        ex = (self.packed.get(i, pad_to=self.pad_to, pad_id=self.pad_id,
                              pad_multiple=self.pad_multiple, per_segment=self.per_segment)
              if self.pad_to or self.pad_multiple or self.pad_rows else self.packed[i])
        return {k: (torch.from_numpy(v) if hasattr(v, "dtype") else v) for k, v in ex.items()}


def collate_tensors(examples: list[dict], pad_multiple: int | None = None,
                    per_segment: bool = False, pad_id: int = 0,
                    max_docs: int | None = None) -> dict:
    """Flatten packs into one ``[1, N]`` row of tensors: input_ids, labels, position_ids
    (int64), cu_seq_lens_q/k (int32), max_length_q/k (int), seq_idx (int32), and for aligned
    packs cu_seqlens_padded. ``pad_multiple``, ``per_segment``: see
    ``packtool.formats.packed.batching.pad_example``; ``max_docs``: cu_seq_lens of a fixed B x K + 1
    (see ``collate_numpy``; bind them with functools.partial)."""
    as_np = [{k: (v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v))
              for k, v in ex.items()} for ex in examples]
    row = collate_numpy(as_np, pad_multiple=pad_multiple, per_segment=per_segment, pad_id=pad_id,
                        max_docs=max_docs)
    return {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in row.items()}


def collate_mds(samples: list[dict], pad_multiple: int | None = None,
                per_segment: bool = False, pad_id: int = 0) -> dict:
    """The collator for ``packtool export --format mds`` read by MosaicML Streaming::

        ds = streaming.StreamingDataset(local="out/mds", batch_size=4, shuffle=True)
        loader = streaming.StreamingDataLoader(ds, batch_size=4, collate_fn=collate_mds)

    MDS samples are packs of different lengths (input_ids, position_ids, cu_seqlens, labels
    int32; loss_mask where the data has one, already folded into labels), so the default
    collate, which stacks, fails on them. This flattens them into one ``[1, N]`` row, the keys
    of :func:`collate_tensors` (``model_inputs(batch)`` takes it from there)."""
    need = ("input_ids", "position_ids", "cu_seqlens", "labels")
    for j, s in enumerate(samples):
        missing = [k for k in need if k not in s]
        if missing:
            raise PacktoolError(f"sample {j} of the batch lacks {', '.join(missing)}: "
                                "collate_mds reads packtool's MDS export (packtool export "
                                "--format mds); export again, or use another collator")
    return collate_tensors([{k: s[k] for k in need} for s in samples],
                           pad_multiple=pad_multiple, per_segment=per_segment, pad_id=pad_id)


def model_inputs(batch: dict, varlen: bool = True, position_ids_start: int = 0,
                 mask: str | None = None, dtype=None) -> dict:
    """The keys to pass to a Hugging Face causal LM, never an attention mask: input_ids,
    labels, position_ids and (``varlen=True``, the default) cu_seq_lens_q/k and
    max_length_q/k, which the transformers padding-free docs recommend over inferring segments
    from position ids (that inference breaks under ``torch.compile`` and for linear-attention
    models; eager and sdpa attention ignore the keys). ``position_ids_start``: added to every
    position (RoBERTa-family models count from 2, padding_idx + 1). An aligned batch's
    cu_seq_lens_q/k are its ``cu_seqlens_padded``: a Hugging Face kernel indexes the row with
    them, and each segment's pads, after its tokens, change nothing a real token sees.

    A batch with images (:class:`packtool.train.vision.ImageCollator`) adds pixel_values and
    image_grid_thw, and its position_ids are ``[4, 1, N]``: the text positions, then the
    mRoPE rows (t, h, w), each restarting per document. That is the layout Qwen-VL models
    take for packed rows: transformers keeps the documents apart from the first row (sdpa,
    eager, flash-attn), where three rows alone are read as one sequence (``packtool
    conformance --arch qwen2_vl`` shows the leak)."""
    if mask is not None:
        return _with_4d_mask(batch, mask, position_ids_start, dtype)
    if is_shared(batch):
        conflicts.check({"shared_rows", "varlen"}, "this batch shares prefixes")
    keys = MODEL_KEYS + (("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
                         if varlen else ())
    out = {k: batch[k] for k in keys}
    if varlen and "cu_seqlens_padded" in batch:
        out["cu_seq_lens_q"] = out["cu_seq_lens_k"] = batch["cu_seqlens_padded"]
    return _positions(batch, out, position_ids_start)


def _positions(batch: dict, out: dict, start: int) -> dict:
    """``out`` with the position ids moved on by ``start`` and, for a batch with images, in
    the ``[4, 1, N]`` mRoPE layout beside the image keys."""
    if start:
        out["position_ids"] = out["position_ids"] + start
    if "position_ids_3d" in batch:
        pos3 = batch["position_ids_3d"]
        out["position_ids"] = torch.cat([out["position_ids"][None].to(pos3.dtype), pos3])
    out.update({k: batch[k] for k in IMAGE_KEYS if k in batch})
    return out


def _with_4d_mask(batch: dict, mask: str, position_ids_start: int, dtype=None) -> dict:
    """input_ids, labels, position_ids and a [1, 1, T, T] ``attention_mask`` that transformers
    passes on as it is (a 4-D mask is taken as prepared): the ancestor-causal mask of the
    row's tree (:mod:`.trees`; a plain row's segments kept apart). Boolean (True = attend)
    for sdpa; ``dtype`` (the model's, e.g. torch.float32) makes it additive (0, or the
    dtype's minimum), which eager attention needs: it adds the mask to the scores, so a
    boolean would add 0 or 1 and mask nothing (transformers 5.24, tested). O(T^2) elements:
    64 Mi at 8,192 tokens; use block_mask with FlexAttention for long rows."""
    if mask != "4d":
        raise PacktoolError(f"mask={mask!r}: the one mask model_inputs makes is '4d' (a "
                            "boolean [batch, 1, tokens, tokens] attention_mask)")
    out = _positions(batch, {k: batch[k] for k in MODEL_KEYS}, position_ids_start)
    device = batch["input_ids"].device
    m = torch.from_numpy(allowed(batch))[None, None].to(device)
    if dtype is not None:
        m = torch.zeros(m.shape, dtype=dtype, device=device).masked_fill(
            ~m, torch.finfo(dtype).min)
    out["attention_mask"] = m
    return out


MASK_CACHE = 8  # block masks kept: a step's layers (and micro-batches) reuse one

_masks: OrderedDict = OrderedDict()


def block_mask(batch: dict, device=None, block_size: int = 128):
    """The FlexAttention ``BlockMask`` of a collated batch (:func:`collate_tensors`): a query
    sees the keys of its own segment up to itself and, in a row of shared prefixes, every
    ancestor segment's (the ancestor-causal mask of :mod:`.trees`)::

        from torch.nn.attention.flex_attention import flex_attention
        out = flex_attention(q, k, v, block_mask=block_mask(batch))  # q: [1, heads, N, d]

    Segments are the batch's ``cu_seq_lens_q`` (or ``cu_seqlens``); where the batch also has
    ``cu_seq_lens_q_padded`` / ``cu_seqlens_padded`` (aligned rows, ``pack --align``), those:
    a pad then belongs to its segment, after its last real token, so causality keeps every real
    token from seeing it (and its label is -100). Row pads (``pad_to``) are segments of their
    own. ``device``: where the mask lives (default: the batch's ``input_ids``' device).

    ``create_block_mask`` evaluates the mask at every (query, key) pair of the row: ~0.3 s for
    2,000 tokens on one CPU core, and ten times the attention's own time for document masks on a
    GPU (attention-gym #149). Every layer of a step asks for the same mask, so the last
    ``MASK_CACHE`` are kept, keyed by the boundaries' bytes, the row's length, the device and
    ``block_size``: the same boundaries give the same object back. Without ``torch.compile``,
    ``flex_attention`` runs an unfused eager path that materialises the scores (it warns so):
    exact, and fine on CPU for a check (forward only: FlexAttention has no backward on CPU in
    torch 2.13); train on a GPU with ``torch.compile(flex_attention)``.
    """
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError as e:  # pragma: no cover - torch < 2.5
        raise ImportError("block_mask needs FlexAttention (torch >= 2.5): pip install -U torch"
                          ) from e
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
            or block_size < 1:
        raise PacktoolError(f"block_size must be an integer >= 1 (FlexAttention's tile, "
                            f"default 128), got {block_size!r}")
    cu, n = _segments(batch)
    tree = row_tree(batch)
    if device is None:
        ids = batch["input_ids"]
        device = ids.device if isinstance(ids, torch.Tensor) else torch.device("cpu")
    device = torch.device(device)
    key = (cu.tobytes(), tree.parent.tobytes(), n, str(device), int(block_size))
    if key in _masks:
        _masks.move_to_end(key)
        return _masks[key]
    tin = torch.from_numpy(tree.tree_in.astype(np.int32)).to(device)
    tout = torch.from_numpy(tree.tree_out.astype(np.int32)).to(device)

    def ancestor_causal(b, h, q_idx, kv_idx):  # two comparisons and causality (.trees)
        return (q_idx >= kv_idx) & (tin[kv_idx] <= tin[q_idx]) & (tin[q_idx] < tout[kv_idx])

    mask = create_block_mask(ancestor_causal, None, None, n, n, device=device,
                             BLOCK_SIZE=block_size)
    _masks[key] = mask
    while len(_masks) > MASK_CACHE:
        _masks.popitem(last=False)
    return mask


def _segments(batch: dict) -> tuple[np.ndarray, int]:
    """The batch's segment boundaries (int64, padded ones first) and its row length, checked."""
    key = next((k for k in ("cu_seq_lens_q_padded", "cu_seqlens_padded", "cu_seq_lens_q",
                            "cu_seqlens") if k in batch), None)
    if key is None or "input_ids" not in batch:
        raise PacktoolError("block_mask takes a collated batch (collate_tensors: input_ids and "
                            f"cu_seq_lens_q); got keys {sorted(batch)}")
    ids = batch["input_ids"]
    if ids.ndim == 2 and ids.shape[0] != 1:
        raise PacktoolError(f"input_ids has shape {tuple(ids.shape)}: block_mask takes one "
                            "[1, N] row (collate_tensors flattens a batch into one)")
    n = int(ids.shape[-1])
    v = batch[key]
    cu = np.asarray(v.cpu().numpy() if isinstance(v, torch.Tensor) else v, np.int64).ravel()
    if len(cu) < 1 or cu[0] != 0 or cu[-1] != n or (np.diff(cu) < 0).any():
        raise PacktoolError(f"{key} {cu.tolist()[:8]}{'...' if len(cu) > 8 else ''} does not "
                            f"run from 0 up to the row's {n:,} tokens without going down: a "
                            "token outside every segment would attend to nothing; pass the "
                            "batch as collate_tensors made it (aligned rows: with their "
                            "cu_seq_lens_q_padded)")
    return cu, n


class PackBatchSampler(_sampler.PackSampler, torch.utils.data.Sampler):
    """``DataLoader(ds, batch_sampler=PackBatchSampler(...))``: this rank's steps, each a list
    of ``batch_size`` pack indices (with ``tokens_per_step=T``, ``T / L / world_size`` rows of
    one slot length); ``len()`` counts steps. Same state as ``PackSampler``,
    which a DataLoader takes as it is (``DataLoader(ds, sampler=PackSampler(...),
    batch_size=<its batch_size>)``: this rank's pack indices one at a time, a step handed out
    once its last pack is; ``packtool.torch.PackSampler`` is that one class).

    Both samplers implement torchdata's ``Stateful`` protocol (``state_dict()`` /
    ``load_state_dict``), so ``torchdata.stateful_dataloader.StatefulDataLoader`` checkpoints
    them with the batch it yields, prefetching workers or not::

        loader = StatefulDataLoader(ds, batch_sampler=sampler, collate_fn=collate_tensors,
                                    num_workers=4)
        ckpt = loader.state_dict()            # after N batches: resumes at batch N
        loader.load_state_dict(ckpt)          # same num_workers (torchdata's rule)
        sampler.load_state_dict(sampler_state(ckpt))   # or: another world size / batch size
    """

    def __iter__(self):
        return self.steps()

    def __len__(self) -> int:
        return self.n_steps - self.start_step


def sampler_state(loader_state: dict) -> dict:
    """The PackSampler state inside a ``StatefulDataLoader.state_dict()`` (num_workers 0 or
    more; ``batch_sampler=`` or ``sampler=``), to resume under another world size, batch size or
    number of workers, where torchdata's own ``load_state_dict`` refuses (it needs the same
    ``num_workers``): ``sampler.load_state_dict(sampler_state(ckpt))`` and a fresh loader."""
    found = next(_states(loader_state), None)
    if found is None:
        raise PacktoolError("no PackSampler state in this loader state: was the loader built with "
                            "a packtool PackSampler / PackBatchSampler?")
    return found


def _states(v):
    """The sampler states in a loader state's dicts, depth first."""
    if is_state(v):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from _states(x)
