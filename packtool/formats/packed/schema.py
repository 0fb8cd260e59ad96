"""The packed format's schema: the arrays of a shard (per version and layout), the keys of
``index.json`` and of a shard entry, every one documented (a test checks docs/FORMAT.md
against them) and checked on read in one place, and the rule that picks each array's dtype.

Version 2 stores a pack as what it is, a list of segments (source document, offset, length):

    layout "index"   the plan only: 8-12 bytes a segment (~2% of the token bytes at 500-token
                     documents); tokens are read from the source corpus at load time
    layout "tokens"  the plan plus the packs' tokens back to back (1.00-1.01x the token
                     bytes; a loss mask is folded into the token word's free top bit where the
                     id space leaves one, else packed 1 bit a token)

and derives ``position_ids``, ``doc_ids``, ``cu_seqlens`` and ``labels`` at load. Version 1
(tokens, positions and segment ids stored per token: ~3x) stays readable.

Version 3 is version 2 with every segment aligned (``pack --align K``, or ``--cp/--tp/--fp8``):
the same shard files, and ``align``, ``pad_id``, ``parallel`` and ``n_align_tokens`` in
index.json; a row places segment j's tokens at its padded start and pads up to the next
(Transformer Engine's ``cu_seqlens_padded``), all derived at load. It has its own version
because a version-2 reader would lay the segments end to end, without their pads. Unaligned
datasets are still written as version 2.

Version 4 is version 2 cut by ``pack --vsl MIN:MAX`` (variable sequence length): the same shard
files, and ``vsl`` in index.json. A row is one chunk of 2**k tokens (MIN <= 2**k <= MAX, at a
multiple of 2**k in its document) or a remnant row of at most MIN tokens (pieces under MIN,
each at a multiple of MIN); its slot length, max(MIN, its tokens), follows from the segment
table. Its own version because a version-2 validator refuses those offsets (it asks every
piece to start at a multiple of seq_len) and a version-2 reader knows no row lengths.

Version 5 is version 2 of pairs and groups: ``seg_group`` and ``seg_role`` per segment and
``groups`` in index.json. One number means one layout: datasets of pairs and groups written
before version 5 say version 4 (with ``groups``, never ``vsl``) and are read as version 5.

Version 6 is version 5 of prefix trees (``pack --share-prompt``, depth 1, and ``pack
--share-prefix``, any depth): ``seg_up`` per segment (the distance back, in segments of its
pack, to its parent; 0 a root), a pack's segments in pre-order, and ``trees`` in index.json
(``groups`` too when the sources are pairs or groups). Its own version because a version-5
reader would lay a tree's segments side by side, each a sequence of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._manifest import (
    Key,
    anything,
    boolean,
    count,
    dict_of,
    hexstr,
    integer,
    list_of,
    nullable,
    number,
    obj,
    one_of,
    string,
)

FORMAT = "packtool.packed"
VERSION = 2
ALIGNED_VERSION = 3  # version 2 plus the alignment keys: written only for aligned datasets
MAX_ALIGN = 2**20  # an alignment K is below this (pack refuses more, naming it)
VSL_VERSION = 4      # version 2 plus the vsl key: written only for pack --vsl datasets
GROUPED_VERSION = 5  # version 2 plus pairs/groups (seg_group, seg_role, "groups"); 4 before
TREES_VERSION = 6    # version 5 plus prefix trees (seg_up, "trees"; "groups" optional)
READABLE = (1, 2, 3, 4, 5, 6)
ROLE_SHARED, ROLE_RECORD = 0, 65535  # seg_role of a shared segment, of a plain record's leaf
INDEX = "index.json"
DIGEST_KEY = "index_sha256"
LAYOUTS = ("index", "tokens")
MASK_STORAGE = ("source", "folded", "bits")  # index layout / tokens layout, per id space
IGNORE_INDEX = -100
VALID = "valid"
FIX = "re-run packtool pack"


@dataclass(frozen=True)
class Array:
    """One array of a shard: ``shard-KKKKK.<name>.npy``, 1-D, little-endian."""

    name: str
    per: str      # "pack+1", "segment", "token", "bit" (ceil(tokens / 8)): sets its length
    dtype: str    # a numpy dtype string, or a role resolved by index.json's "dtypes"
    doc: str
    layout: str | None = None    # only in this layout
    mask: str | None = None      # only with this mask storage
    grouped: bool = False        # only in a dataset of pairs or groups (version 5; 4 before)
    tree: bool = False           # only in a dataset of prefix trees (version 6)


SCHEMA = (
    Array("pack_seg", "pack+1", "segment_index",
          "first segment of each pack, then the segment count: pack j is segments "
          "ps[j]:ps[j+1]"),
    Array("seg_doc", "segment", "document", "source document (global over the sources, in the "
          "order they were given)"),
    Array("seg_offset", "segment", "offset", "token offset of the segment in its document"),
    Array("seg_length", "segment", "length", "tokens in the segment (1 to seq_len)"),
    Array("seg_group", "segment", "group", "version 5: the segment's group (its index over the "
          "sources' groups; version 6 of plain records: its tree's index over the dataset)",
          grouped=True),
    Array("seg_role", "segment", "<u2", "version 5: the segment's role: 0 a shared prompt, 1 "
          "chosen, 2 rejected, 3 + k completion k (version 6: 0 any shared segment, 65535 a "
          "plain record's leaf)", grouped=True),
    Array("seg_up", "segment", "length", "version 6: segments back, within the pack, to the "
          "segment's parent (0: a root); a pack's segments in pre-order", tree=True),
    Array("tokens", "token", "token", "the packs' tokens back to back (with the loss mask in "
          "the top bit when mask_storage is \"folded\")", layout="tokens"),
    Array("loss_mask", "bit", "|u1", "1 bit a token, np.packbits(mask, bitorder=\"little\"): "
          "1 = trained on", layout="tokens", mask="bits"),
)

V1_SCHEMA = (  # version 1, read only: see docs/FORMAT.md
    Array("tokens", "token", "token", "token ids"),
    Array("position_ids", "token", "position", "position in its segment"),
    Array("doc_ids", "token", "position", "segment index within its pack"),
    Array("pack_offsets", "pack+1", "<i8", "pack j is tokens[po[j]:po[j+1]]"),
    Array("seg_offsets", "pack+1", "<i8", "pack j's segments are so[j]:so[j+1]"),
    Array("cu_seqlens", "segment+pack", "<i4", "each pack's cu_seqlens back to back"),
    Array("source_docs", "segment", "<i8", "source document"),
    Array("source_offsets", "segment", "<i8", "token offset in that document"),
    Array("loss_mask", "token", "|u1", "1 = trained on", mask="v1"),
)


def shard_arrays(index: dict) -> tuple[Array, ...]:
    """The arrays a shard of this dataset holds."""
    if index["version"] == 1:
        return tuple(a for a in V1_SCHEMA if a.mask is None or index.get("loss_mask"))
    return tuple(a for a in SCHEMA if (a.layout is None or a.layout == index["layout"])
                 and (a.mask is None or a.mask == index.get("mask_storage"))
                 and (not a.grouped or index.get("groups") is not None
                      or index.get("trees") is not None)
                 and (not a.tree or index.get("trees") is not None))


def array_length(array: Array, n_tokens: int, n_packs: int, n_segments: int) -> int:
    return {"token": n_tokens, "pack+1": n_packs + 1, "segment": n_segments,
            "segment+pack": n_segments + n_packs, "bit": -(-n_tokens // 8)}[array.per]


def narrowest(top: int) -> np.dtype:
    """The smallest unsigned little-endian integer type that holds 0..top."""
    for dt in ("<u1", "<u2", "<u4"):
        if top <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype("<u8")


def v2_dtypes(*, token_dtype: np.dtype, seq_len: int, n_docs: int, max_doc_len: int,
              max_shard_tokens: int) -> dict[str, np.dtype]:
    """Each role's dtype from bounds known before any pack is made (so every task of a
    distributed run picks the same): segments per shard <= its tokens."""
    return {"segment_index": narrowest(max(max_shard_tokens, 1)),
            "document": narrowest(max(n_docs - 1, 1)), "offset": narrowest(max(max_doc_len, 1)),
            "length": narrowest(seq_len), "token": np.dtype(token_dtype).newbyteorder("<")}


def mask_storage(token_dtype: np.dtype, vocab_size: int) -> str:
    """Fold the mask into the token word when its top bit is never an id, else 1 bit."""
    bits = np.dtype(token_dtype).itemsize * 8
    return "folded" if vocab_size <= 1 << (bits - 1) else "bits"


def array_dtype(array: Array, index: dict) -> np.dtype:
    if array.dtype.startswith(("<", "|")):
        return np.dtype(array.dtype)
    if index["version"] == 1:
        seq = int(index["seq_len"])
        return (np.dtype(index["token_dtype"]).newbyteorder("<") if array.dtype == "token"
                else np.dtype("<u2") if seq <= 65_536 else np.dtype("<u4"))
    return np.dtype(index["dtypes"][array.dtype])


# ------------------------------------------------------------------------- index.json
SHARD_FILE = obj({"name": string(True), "crc32": hexstr(8), "bytes": count()})


def _cells(v) -> str | None:
    """[k0, n0, n1, ...]: the lowest occupied cell, then the packs per cell from it on."""
    if type(v) is not list or not all(type(x) is int for x in v) or len(v) == 1 \
            or any(x < 0 for x in v[1:]):
        return "[k0, n0, n1, ...]: a cell, then counts >= 0 (or [] for no pack)"
    return None


SHARD_KEYS = {
    "name": Key(string(True), "the shard's name (shard-KKKKK)"),
    "n_packs": Key(count(), "packs"), "n_segments": Key(count(), "segments"),
    "n_tokens": Key(count(), "tokens"),
    "files": Key(dict_of(SHARD_FILE), "per array: {name, crc32, bytes}"),
    "cost_classes": Key(_cells, "packs per attention-cost cell: [k0, n0, n1, ...], n_i packs in "
                        "cell k0 + i, which holds costs in [cost_ratio^k, cost_ratio^(k+1))",
                        optional=True),
    "costs_sha256": Key(hexstr(16), "the packs' attention costs' sha256 (first 16 digits)",
                        optional=True),
}
_SOURCE = obj({"prefix": string(), "path": nullable(string(True)), "manifest_sha256": hexstr(64),
               "n_docs": count(), "n_tokens": count(), "factor": number(0), "docs_used": count(),
               "tokens_used": count(), "token_share": number(0, 1)})
_HELD_OUT = obj({"path": one_of(VALID), "valid_docs": nullable(count(1)),
                 "valid_fraction": nullable(number(0, 1)), "n_docs_held_out": count(),
                 "n_packs": count(), "n_tokens": count(),
                 "rule": Key(one_of(2), "", optional=True)})
_COUNT_KEYS = ("n_packs", "n_docs", "n_empty", "n_overlong", "n_split", "n_split_pieces",
               "n_truncated", "n_truncated_tokens", "n_dropped", "n_dropped_tokens",
               "n_segments", "n_tokens")
INDEX_KEYS = {  # every key of index.json, documented in docs/FORMAT.md (a test checks it)
    "format": Key(one_of(FORMAT), '"packtool.packed"'),
    "version": Key(one_of(*READABLE), "2, 3 for an aligned dataset, 4 for a --vsl one, 5 for "
                   "pairs and groups (4 before), 6 for prefix trees (1 still read)"),
    "layout": Key(one_of(*LAYOUTS), '"index" (the plan only) or "tokens" (self-contained)'),
    "seq_len": Key(count(1, 2**31), "tokens per pack at most"),
    "algo": Key(string(True), "the packer"),
    "algo_options": Key(anything(), "the packer's options in effect"),
    "balance": Key(nullable(obj({"objective": one_of("attention"), "ranks": count(1)})),
                   "packs in blocks of like attention cost: objective and ranks, or null",
                   optional=True),
    "seed": Key(count(), "shuffle/packer seed"), "shuffle": Key(boolean(), "packs shuffled"),
    "overflow": Key(one_of("split", "truncate", "drop", "refuse"),
                    "split, truncate or drop; a dataset of pairs or groups (version 5, "
                    "never cut): refuse or drop"),
    "token_dtype": Key(one_of("uint16", "uint32"), "uint16 or uint32"),
    "vocab_size": Key(count(1), "the sources' id space"),
    "loss_mask": Key(boolean(), "labels follow the sources' loss masks"),
    "mask_storage": Key(nullable(one_of(*MASK_STORAGE)), "where the loss mask is: "
                        '"source" (index layout), "folded" or "bits" (tokens layout), or null'),
    "dtypes": Key(obj({}), "numpy dtype string per array role"),
    "group_docs": Key(nullable(count(1)), "documents per independently packed group "
                      "(--group-docs), or null"),
    **{k: Key(count(), doc) for k, doc in zip(_COUNT_KEYS, (
        "packs", "source documents", "zero-length documents", "documents longer than seq_len",
        "documents split", "pieces they became", "documents truncated",
        "tokens cut by truncation", "documents dropped", "tokens dropped",
        "segments in all packs", "tokens in all packs"), strict=True)},
    "efficiency": Key(number(0, 1), "n_tokens / (n_packs * seq_len)"),
    "lower_bound_packs": Key(count(), "L1: ceil(n_tokens / L)"),
    "gap_percent": Key(number(), "packs above L1, %"),
    "l2_bound_packs": Key(count(), "Martello-Toth L2"),
    "lp_bound_packs": Key(nullable(count()), "LP bound when optimal ran, else null"),
    "lp_converged": Key(nullable(boolean()), "whether that LP converged, or null"),
    "best_bound_packs": Key(count(), "max of the valid bounds"),
    "gap_to_best_bound_percent": Key(number(), "packs above the best bound, %"),
    "packing_factor": Key(number(0), "sequences per pack (a shared prompt is a segment, no "
                          "sequence)"),
    "cost_ratio": Key(number(1), "the grid of the shards' cost_classes (see "
                      "packtool.formats.packed.costs)", optional=True),
    "cost_vision": Key(number(0), "the vision term's weight in the shards' cost_classes: 1.0 "
                       "where the sources hold images", optional=True),
    "attention_imbalance": Key(nullable(number(0)), "max/mean pack attention cost over "
                               "consecutive packs, one per rank (see docs/TRAINING.md)",
                               optional=True),
    "solver": Key(obj({}), "the packer's report (PackerReport.to_json())"),
    "sources": Key(list_of(_SOURCE), "per source prefix: where it is, its manifest sha256, "
                   "counts and the mixture"),
    "split": Key(one_of("train", "valid"), '"train", or "valid" for the held-out packs in '
                 "DIR/valid"),
    "held_out": Key(nullable(_HELD_OUT), "the held-out split (path, how chosen, counts), or "
                    "null"),
    "shards": Key(list_of(obj(SHARD_KEYS)), "per shard: name, counts, files"),
    "created_by": Key(string(), '"packtool X.Y.Z"'),
    DIGEST_KEY: Key(hexstr(64), "sha256 of the index without this key"),
}
_PARALLEL = obj({"cp": nullable(count(1)), "tp": nullable(count(1)),
                 "sequence_parallel": boolean(), "fp8": boolean()})
ALIGN_KEYS = {  # version 3 only: an aligned dataset
    "align": Key(count(2, MAX_ALIGN), "K: every segment padded to a multiple of K in its row"),
    "pad_id": Key(count(), "the token id of the alignment pads"),
    "parallel": Key(_PARALLEL, "what set K: cp, tp (null if not given), sequence_parallel, "
                    "fp8"),
    "n_align_tokens": Key(count(), "pad tokens the alignment adds over all packs"),
    "pad_from": Key(one_of("option", "tokenizer", "eos"), "where pad_id came from: --pad-id, "
                    "the source tokenizer's pad (else eos) token, or tokenize's --eos id "
                    "(verify --source recomputes the last two; absent before issue 38)",
                    optional=True),
}
_VSL = obj({"min": count(1, 2**30), "max": count(1, 2**30), "rows": dict_of(count()),
            "n_remnant_rows": count(), "n_remnant_tokens": count(), "n_slot_tokens": count()})
VSL_KEYS = {  # version 4 only: a --vsl dataset
    "vsl": Key(_VSL, "MIN and MAX of --vsl; chunk rows per slot length (\"256\": count), "
               "remnant rows and their tokens, and the slot tokens (sum of row_length)"),
}
INDEX_KEYS.update({k: Key(v.spec, v.doc, optional=True) for k, v in ALIGN_KEYS.items()})
_GROUPS = obj({"kind": one_of("pairs", "completions"), "share_prompt": boolean(),
               "n_groups": count(), "n_dropped_groups": count()})
INDEX_KEYS["groups"] = Key(_GROUPS, "version 5 only (4 before): {kind (pairs or completions), "
                           "share_prompt, n_groups (in the sources), n_dropped_groups (over "
                           "--seq-len, with --overflow drop)}", optional=True)
INDEX_KEYS.update({k: Key(v.spec, v.doc, optional=True) for k, v in VSL_KEYS.items()})
_TREES = obj({"source": one_of("groups", "records", "tree_field"),
              "min_shared": nullable(count(1)), "n_trees": count(), "n_split_trees": count(),
              "n_shared_segments": count(), "n_tokens_flat": count(),
              "n_tokens_stored": count()})
INDEX_KEYS["trees"] = Key(_TREES, "version 6 only: {source (groups, records or tree_field), "
                          "min_shared (null: --share-prompt, each group's prompt), n_trees, "
                          "n_split_trees (record sets over --seq-len cut into trees that fit), "
                          "n_shared_segments, n_tokens_flat (the kept records' tokens, each "
                          "whole), n_tokens_stored}", optional=True)
_V4_ONLY = {"groups", "trees", *VSL_KEYS}  # version 4 has one of them (--vsl, or old pairs)
V2_SPEC = obj({k: v for k, v in INDEX_KEYS.items() if k not in ALIGN_KEYS and k not in _V4_ONLY})
V3_SPEC = obj({**{k: v for k, v in INDEX_KEYS.items() if k not in _V4_ONLY}, **ALIGN_KEYS})
V4_SPEC = obj({k: v for k, v in INDEX_KEYS.items() if k not in ALIGN_KEYS})
V1_SPEC = obj({"seq_len": INDEX_KEYS["seq_len"], "token_dtype": INDEX_KEYS["token_dtype"],
               "loss_mask": INDEX_KEYS["loss_mask"], "n_packs": count(), "n_tokens": count(),
               "n_segments": count(), "n_docs": count(),
               "sources": list_of(obj({"prefix": string(), "manifest_sha256": hexstr(64)})),
               "held_out": nullable(_HELD_OUT), "shards": list_of(obj(SHARD_KEYS)),
               "overflow": INDEX_KEYS["overflow"], "seed": integer(),
               DIGEST_KEY: INDEX_KEYS[DIGEST_KEY].spec})
V5_SPEC = obj({k: v for k, v in INDEX_KEYS.items() if k not in ALIGN_KEYS and k not in VSL_KEYS})
SPECS = {1: V1_SPEC, 2: V2_SPEC, 3: V3_SPEC, 4: V4_SPEC, 5: V5_SPEC, 6: V5_SPEC}
VERSION_KEYS = {  # the keys that make each version's layout (docs/FORMAT.md, tested)
    2: (), 3: tuple(ALIGN_KEYS), 4: tuple(VSL_KEYS), 5: ("groups",), 6: ("trees",)}


def parallel_alignment(cp, tp, sequence_parallel, fp8) -> int:
    """The alignment the parallel sizes need: the lcm of 2 x cp, tp under sequence
    parallelism and 16 for fp8 (1: none)."""
    from math import lcm

    return lcm(2 * cp if cp else 1, tp if tp and sequence_parallel else 1, 16 if fp8 else 1)


def disagreement(index: dict) -> str | None:
    """What in an index (its digest recomputed, so consistent-looking) contradicts itself, or
    None: alignment keys outside version 3 (an aligned dataset relabelled version 2 would be
    served unaligned), a K that the parallel sizes it records do not divide into, a --vsl MAX
    that is not seq_len, an overflow a dataset of its kind never has (a group is never cut:
    pairs or groups record "refuse" or "drop", or "split", what packtool wrote before it
    said so, meaning the same refusal; "refuse" belongs to such a dataset only)."""
    grouped = bool(index.get("groups") or index.get("trees"))
    if (grouped and index["overflow"] == "truncate") or (
            not grouped and index["overflow"] == "refuse"):
        return (f"overflow {index['overflow']!r} in a dataset "
                f"{'of' if grouped else 'without'} pairs or groups")
    version = int(index["version"])
    if version >= 2:
        for v, keys in VERSION_KEYS.items():
            stray = sorted(k for k in keys if k in index)
            legacy = v == GROUPED_VERSION and version == VSL_VERSION and "vsl" not in index
            trees = v == GROUPED_VERSION and version == TREES_VERSION  # trees of pairs/groups
            if stray and v != version and not legacy and not trees:
                return (f"version {version} with the keys {', '.join(stray)} of version {v} "
                        f"(one version, one layout)")
        if version > VERSION and not any(k in index for k in VERSION_KEYS[version]) and not (
                version == VSL_VERSION and "groups" in index):
            return f"version {version} without its keys {', '.join(VERSION_KEYS[version])}"
    if version == ALIGNED_VERSION and int(index["align"]) % (
            m := parallel_alignment(**index["parallel"])):
        return (f"align {index['align']} disagrees with parallel {index['parallel']}: they "
                f"need a multiple of {m}")
    vsl = index.get("vsl") if version == VSL_VERSION else None
    if vsl and (vsl["max"] != index["seq_len"] or vsl["min"] > vsl["max"]):
        return (f"vsl min {vsl['min']:,} max {vsl['max']:,} disagrees with seq_len "
                f"{index['seq_len']:,} (a --vsl dataset's seq_len is its MAX, MIN <= MAX)")
    return None


def alignment(index: dict) -> tuple[int, int]:
    """(K, pad id) of a dataset: (1, 0) but in version 3 (the key is read nowhere else)."""
    if int(index["version"]) != ALIGNED_VERSION:
        return 1, 0
    return int(index["align"]), int(index["pad_id"])


def vsl_bounds(index: dict) -> tuple[int, int] | None:
    """(MIN, MAX) of a --vsl dataset (version 4), else None."""
    if int(index["version"]) != VSL_VERSION or not index.get("vsl"):
        return None  # version 4 of pairs and groups: fixed-length rows
    return int(index["vsl"]["min"]), int(index["vsl"]["max"])
