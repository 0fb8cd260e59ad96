"""The packed format's validator: what the reader checks when it opens each shard, for every
shard at once, plus what only a full pass can see (every pack's invariants, the index's
totals, token ids inside the id space). What a dataset must hold given its sources is
``packtool verify --source``'s business (:mod:`packtool.verify`), computed independently."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .files import ValidationError
from .layout import align_up, fold_shift
from .reader import PackedReader
from .schema import INDEX, alignment, vsl_bounds

_V1_MESSAGES = {
    1: "offsets do not start at 0",
    2: "a pack is empty",
    3: "a pack is longer than seq_len",
    4: "a pack has no segments",
    5: "cu_seqlens does not start at 0",
    6: "cu_seqlens does not end at the pack's length",
    7: "cu_seqlens does not strictly increase within the pack (empty or overlong segment)",
    8: "doc_ids do not number the pack's segments 0, 1, ...",
    9: "position_ids do not restart at 0 in the segment",
    10: "offsets point past the end of the shard's arrays",
}


def _check_v1(sh, seq_len: int) -> None:
    """Version 1 stores positions and segment ids per token: each must be what the segment
    lengths say."""
    from .._kernels import check_shard

    a = sh.arrays
    code, p, t = check_shard(a["pack_offsets"], a["seg_offsets"], a["cu_seqlens"],
                              a["position_ids"], a["doc_ids"], seq_len)
    if code:
        raise ValidationError(f"{sh.name} pack {p} (token {t}): {_V1_MESSAGES[code]}")


def _check_tokens(sh, ds: PackedReader) -> None:
    """Token ids below the id space (a folded mask bit aside)."""
    vocab = int(ds.index.get("vocab_size") or 0)
    if not vocab or "tokens" not in sh.arrays or not sh.arrays["tokens"].size:
        return
    tokens, top = sh.arrays["tokens"], 0
    folded = ds.index.get("mask_storage") == "folded"
    keep = (1 << fold_shift(ds.token_dtype)) - 1
    for a in range(0, tokens.size, 1 << 22):  # a chunk at a time: no copy of the shard
        chunk = np.asarray(tokens[a:a + (1 << 22)])
        top = max(top, int((chunk & keep).max() if folded else chunk.max()))
    if top >= vocab:
        raise ValidationError(f"{sh.name}: token id {top:,} >= vocab_size {vocab:,}")


def _check_seq_len(index: dict, where: str) -> None:
    """The figures index.json derives from seq_len agree with it: efficiency and the L1
    bound. (An edit of seq_len alone is caught here; one that recomputes them too is caught
    by the segment offsets when a document was split, else only by verify --source.)"""
    L, n, p = int(index["seq_len"]), int(index["n_tokens"]), int(index["n_packs"])
    l1, eff = -(-n // L), (n / (p * L) if p else 1.0)
    if index.get("lower_bound_packs", l1) != l1 or not math.isclose(
            index.get("efficiency", eff), eff, rel_tol=1e-9):
        raise ValidationError(
            f"{where}: efficiency {index.get('efficiency')} and lower_bound_packs "
            f"{index.get('lower_bound_packs')} are not those of n_tokens {n:,} in n_packs {p:,} "
            f"of seq_len {L:,} ({eff:.6g}, {l1:,}): the index was edited; re-run packtool pack")


def _check_trees(sh) -> None:
    """Every pack's ``seg_up`` is a forest in pre-order (a parent inside the pack, before its
    child, and on the path open at the child: each subtree contiguous), a record's segment
    (role > 0) always a leaf and a shared one (role 0) never (in pre-order a segment has
    children iff the next one's parent is it)."""
    ps = np.asarray(sh.pack_seg, np.int64)
    up = np.asarray(sh.arrays["seg_up"], np.int64)
    role = np.asarray(sh.arrays["seg_role"], np.int64)
    for j in np.unique(np.searchsorted(ps, np.flatnonzero(up), side="right") - 1).tolist():
        path: list[int] = []  # the open path: ancestors of the next segment
        for s in range(int(ps[j]), int(ps[j + 1])):
            p = s - int(up[s]) if up[s] else -1
            if p != -1 and (p < ps[j] or p not in path):
                raise ValidationError(
                    f"{sh.name} pack {j:,} segment {s - int(ps[j])}: seg_up {int(up[s])} "
                    "points " + ("outside its pack" if p < ps[j] else "to a segment whose "
                                 "subtree has closed (not pre-order)") + "; the shard is "
                    "damaged, re-run packtool pack")
            while path and path[-1] != p:
                path.pop()
            path.append(s)
    first = np.zeros(up.size, bool)
    first[ps[:-1][ps[:-1] < up.size]] = True
    nxt_up = np.append(up[1:], 0)
    nxt_first = np.append(first[1:], True)
    parent_of_next = (nxt_up == 1) & ~nxt_first
    bad = np.flatnonzero((role == 0) != parent_of_next)
    if bad.size:
        s = int(bad[0])
        j = int(np.searchsorted(ps, s, side="right")) - 1
        raise ValidationError(f"{sh.name} pack {j:,} segment {s - int(ps[j])}: role "
                              f"{int(role[s])} but " + ("no" if role[s] == 0 else "a")
                              + " segment below it: a record's end is always a leaf, a shared "
                              "segment never; the shard is damaged, re-run packtool pack")


def _check_offsets(sh, seq_len: int) -> None:
    """Every segment starts at a multiple of seq_len in its document: only --overflow split
    cuts a document, every seq_len tokens."""
    off = np.asarray(sh.seg_offset)
    for a in range(0, off.size, 1 << 22):  # int64 a chunk at a time (offsets may be uint8)
        bad = np.flatnonzero(off[a:a + (1 << 22)].astype(np.int64) % seq_len)
        if not bad.size:
            continue
        i = a + int(bad[0])
        raise ValidationError(
            f"{sh.name}: segment {i:,} starts at token {int(off[i]):,} of its document, not a "
            f"multiple of seq_len {seq_len:,} (--overflow split cuts every seq_len tokens): "
            f"{INDEX}'s seq_len was edited or the shard is another dataset's")


def _check_vsl(sh, lo: int, hi: int, tally: dict) -> None:
    """Every row of a --vsl shard is one chunk (a single segment of 2**k tokens, MIN <= 2**k
    <= MAX, at a multiple of 2**k in its document) or a remnant row (pieces under MIN tokens,
    each at a multiple of MIN, at most MIN in all); adds the rows to ``tally``."""
    ln = np.asarray(sh.seg_length, np.int64)
    off = np.asarray(sh.seg_offset, np.int64)
    ps = np.asarray(sh.pack_seg, np.int64)
    nseg, tokens = np.diff(ps), np.diff(sh.po)
    chunk_row = (nseg == 1) & (tokens >= lo)
    seg_row = np.repeat(np.arange(nseg.size), nseg)
    pow2 = (ln & (ln - 1)) == 0
    ok = np.where(chunk_row[seg_row], pow2 & (ln <= hi) & (off % np.maximum(ln, 1) == 0),
                  (ln < lo) & (off % lo == 0))
    bad_rows = ~chunk_row & (tokens > lo)
    if not ok.all() or bad_rows.any():
        j = int(np.flatnonzero(bad_rows)[0]) if bad_rows.any() else \
            int(seg_row[np.flatnonzero(~ok)[0]])
        raise ValidationError(
            f"{sh.name} pack {j:,}: {int(nseg[j])} segment(s), {int(tokens[j]):,} tokens (lengths "
            f"{ln[ps[j]:ps[j + 1]][:8].tolist()}, offsets {off[ps[j]:ps[j + 1]][:8].tolist()}) is "
            f"neither a chunk of 2**k tokens in {lo:,}..{hi:,} at a multiple of 2**k nor a "
            f"remnant row of pieces under {lo:,} at multiples of {lo:,}, at most {lo:,} in all")
    for k, c in zip(*np.unique(tokens[chunk_row], return_counts=True), strict=True):
        tally["rows"][str(int(k))] = tally["rows"].get(str(int(k)), 0) + int(c)
    tally["n_remnant_rows"] += int((~chunk_row).sum())
    tally["n_remnant_tokens"] += int(tokens[~chunk_row].sum())
    tally["n_slot_tokens"] += int(np.maximum(tokens, lo).sum())


def validate_packed(directory: str | Path, checksums: bool = True):
    """Check a packed directory against the schema: index digest and keys, file names,
    sizes, dtypes, crc32, every invariant of every pack. Returns the opened reader (its
    shards checked) or raises :class:`ValidationError` naming shard, pack and token."""
    ds = PackedReader(directory, checksums)
    index = ds.index
    n_docs = sum(s["n_docs"] for s in index["sources"]) if index["version"] >= 2 else None
    totals = {"n_packs": 0, "n_tokens": 0, "n_segments": 0}
    align, pad_id = alignment(index)
    if align > 1:
        totals["n_align_tokens"] = 0
        if pad_id >= int(index["vocab_size"]):
            raise ValidationError(f"{INDEX}: pad_id {pad_id:,} is outside the id space of "
                                  f"{index['vocab_size']:,} tokens; re-run packtool pack")
    where = f"{str(ds.directory).rstrip('/')}/{INDEX}"
    _check_seq_len(index, where)
    vsl = vsl_bounds(index)
    rows = {"rows": {}, "n_remnant_rows": 0, "n_remnant_tokens": 0, "n_slot_tokens": 0}
    for k, entry in enumerate(index["shards"]):
        sh = ds.shard(k)
        if vsl is not None:
            _check_vsl(sh, *vsl, rows)
        elif not (ds.index.get("groups") or {}).get("share_prompt") \
                and not ds.index.get("trees"):  # a tree's segments start inside their
            _check_offsets(sh, ds.seq_len)  # documents (verify.groups, verify.trees)
        if "seg_up" in sh.arrays:
            _check_trees(sh)
        if index["version"] == 1:
            _check_v1(sh, ds.seq_len)
        if n_docs is not None and sh.seg_doc.size and int(np.max(sh.seg_doc)) >= n_docs:
            raise ValidationError(f"{sh.name}: a segment's source document "
                                  f"{int(np.max(sh.seg_doc)):,} is beyond the sources' "
                                  f"{n_docs:,} documents")
        _check_tokens(sh, ds)
        for key in ("n_packs", "n_tokens", "n_segments"):
            totals[key] += entry[key]
        if align > 1:
            totals["n_align_tokens"] += (int(align_up(sh.seg_length, align).sum())
                                         - entry["n_tokens"])
    for key, n in totals.items():
        if index[key] != n:
            raise ValidationError(f"{INDEX}: {key} is {index[key]:,} but the shards hold {n:,}")
    if vsl is not None and (want := {k: index["vsl"][k] for k in rows}) != rows:
        raise ValidationError(f"{where}: vsl says {want}, the shards hold {rows}; the index was "
                              "edited or the shards are another dataset's: re-run packtool pack")
    return ds
