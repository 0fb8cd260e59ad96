"""Stage 2: token files -> packed shards (see packed.py for the format).

    segments = documents after --overflow (split / truncate / drop; empty ones skipped)
    packs    = assign_packs(segment lengths, seq_len, algo)      one int per segment
    order    = packs shuffled with --seed (or the algorithm's order with --no-shuffle)
    shards   = consecutive packs of about --shard-size tokens, streamed to .npy in chunks

Memory: O(documents) int64 arrays for the assignment (10M documents: ~0.5 GB peak) plus a
bounded write chunk; tokens are gathered from the memory-mapped sources chunk by chunk.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import __version__
from ._atomic import atomic_dir
from ._numba import njit
from .errors import PacktoolError
from ._io import NpyMap, NpyWriter, sha256_file
from .formats.packed import ARRAYS, FORMAT, INDEX, MASK, VERSION, array_dtypes, index_digest
from .packers import PACKERS, assign_packs, packer_options
from .formats.tokens import TokenCorpus, open_tokens, prefix_paths

OVERFLOW = ("split", "truncate", "drop")
CHUNK_TOKENS = 1 << 23  # per-token arrays are built and written this many tokens at a time


@dataclass
class Segments:
    doc: np.ndarray      # global source document index
    offset: np.ndarray   # token offset inside that document
    length: np.ndarray
    counts: dict = field(default_factory=dict)


def make_segments(lengths: np.ndarray, seq_len: int, overflow: str = "split") -> Segments:
    """Turn documents into segments of at most ``seq_len`` tokens under an overflow policy.

    Every document and token is accounted for in ``counts``: empty documents are skipped;
    over-long ones are split into ceil(l / L) pieces, truncated to their first L tokens, or
    dropped.
    """
    if overflow not in OVERFLOW:
        raise PacktoolError(f"--overflow {overflow!r}: choose one of {', '.join(OVERFLOW)}")
    lengths = np.asarray(lengths, dtype=np.int64)
    over = lengths > seq_len
    n_over = int(over.sum())
    over_tokens = int(lengths[over].sum())
    counts = {
        "n_docs": int(lengths.size),
        "n_empty": int((lengths == 0).sum()),
        "n_overlong": n_over,
        "n_split": 0, "n_split_pieces": 0,
        "n_truncated": 0, "n_truncated_tokens": 0,
        "n_dropped": 0, "n_dropped_tokens": 0,
    }
    if overflow == "split":
        pieces = -(-lengths // seq_len)
        doc = np.repeat(np.arange(lengths.size, dtype=np.int64), pieces)
        first = np.repeat(np.cumsum(pieces) - pieces, pieces)
        offset = (np.arange(doc.size, dtype=np.int64) - first) * seq_len
        length = np.minimum(lengths[doc] - offset, seq_len)
        counts.update(n_split=n_over, n_split_pieces=int(pieces[over].sum()))
    else:
        keep = lengths > 0
        if overflow == "drop":
            keep &= ~over
            counts.update(n_dropped=n_over, n_dropped_tokens=over_tokens)
        else:
            counts.update(n_truncated=n_over, n_truncated_tokens=over_tokens - n_over * seq_len)
        doc = np.flatnonzero(keep).astype(np.int64)
        offset = np.zeros(doc.size, np.int64)
        length = np.minimum(lengths[doc], seq_len)
    counts["n_segments"] = int(doc.size)
    counts["n_tokens"] = int(length.sum())
    return Segments(doc, offset, length, counts)


@njit
def _order_segments(packs, rank, n_packs):
    """Segments grouped by output pack position (stable); tokens and segments per pack."""
    n = packs.shape[0]
    nseg = np.zeros(n_packs + 1, np.int64)
    for s in range(n):
        nseg[rank[packs[s]] + 1] += 1
    start = np.cumsum(nseg)
    order = np.empty(n, np.int64)
    pos = start[:-1].copy()
    for s in range(n):
        r = rank[packs[s]]
        order[pos[r]] = s
        pos[r] += 1
    return order, nseg[1:]


@njit
def _fill_sidecars(seg_len, pack_nseg, pos_out, doc_out):
    t = 0
    s = 0
    for p in range(pack_nseg.shape[0]):
        for k in range(pack_nseg[p]):
            for j in range(seg_len[s]):
                pos_out[t] = j
                doc_out[t] = k
                t += 1
            s += 1


@njit
def _gather(src, src_start, length, dst, dst_start):
    for s in range(src_start.shape[0]):
        a, b = src_start[s], dst_start[s]
        for j in range(length[s]):
            dst[b + j] = src[a + j]


def open_sources(prefixes: list[str | Path]) -> list[TokenCorpus]:
    if not prefixes:
        raise PacktoolError("no token files given; pass the --out PREFIX of packtool tokenize")
    corpora = [open_tokens(p) for p in prefixes]
    seen = set()
    for c in corpora:
        key = c.prefix.resolve()
        if key in seen:
            raise PacktoolError(f"token files {c.prefix} given twice; each corpus is packed once")
        seen.add(key)
    shas = {c.meta["tokenizer"]["sha256"] for c in corpora}
    if len(shas) > 1:
        raise PacktoolError(
            "the token files were made with different tokenizers (sha256 "
            + ", ".join(sorted(s[:12] for s in shas))
            + "); re-tokenize them with one tokenizer before packing them together"
        )
    return corpora


@dataclass
class PackResult:
    out: str
    algo: str
    seq_len: int
    n_packs: int
    n_tokens: int
    n_segments: int
    efficiency: float
    lower_bound_packs: int
    gap_percent: float
    packing_factor: float
    counts: dict
    seconds: float
    assign_seconds: float
    n_shards: int
    bounds: dict = field(default_factory=dict)

    def summary(self) -> str:
        c = self.counts
        over = []
        if c["n_split"]:
            over.append(f"split {c['n_split']:,} docs into {c['n_split_pieces']:,} pieces")
        if c["n_truncated"]:
            over.append(f"truncated {c['n_truncated']:,} docs (-{c['n_truncated_tokens']:,} tokens)")
        if c["n_dropped"]:
            over.append(f"dropped {c['n_dropped']:,} docs ({c['n_dropped_tokens']:,} tokens)")
        if c["n_empty"]:
            over.append(f"skipped {c['n_empty']:,} empty docs")
        return (
            f"{self.out}: {self.n_packs:,} packs of {self.seq_len:,} ({self.algo}), "
            f"{self.n_tokens:,} tokens, efficiency {100 * self.efficiency:.3f}%, "
            f"lower bound {self.lower_bound_packs:,} packs (gap {self.gap_percent:.3f}%), "
            f"L2 bound {self.bounds['l2_bound_packs']:,}"
            + (f", LP bound {self.bounds['lp_bound_packs']:,}" if self.bounds.get('lp_bound_packs') else "")
            + f" (gap to best {self.bounds['gap_to_best_bound_percent']:.3f}%), "
            f"packing factor {self.packing_factor:.2f}"
            + ("; " + "; ".join(over) if over else "")
            + f"; {self.n_shards} shard(s) in {self.seconds:.1f}s (assignment {self.assign_seconds:.2f}s)"
        )

    def to_json(self) -> dict:
        return asdict(self)


def pack_stats(n_tokens: int, n_packs: int, n_segments: int, seq_len: int,
               seg_lengths: np.ndarray, lp_bound: int | None = None) -> dict:
    """Efficiency, the bounds (L1, Martello-Toth L2, LP when known) and the gap to the best."""
    from .bounds import l2_bound

    lb = -(-n_tokens // seq_len)
    l2 = l2_bound(seg_lengths, seq_len)
    best = max(lb, l2, lp_bound or 0)
    return {
        "efficiency": n_tokens / (n_packs * seq_len) if n_packs else 1.0,
        "lower_bound_packs": lb,
        "gap_percent": 100.0 * (n_packs - lb) / lb if lb else 0.0,
        "l2_bound_packs": l2,
        "lp_bound_packs": lp_bound,
        "best_bound_packs": best,
        "gap_to_best_bound_percent": 100.0 * (n_packs - best) / best if best else 0.0,
        "packing_factor": n_segments / n_packs if n_packs else 0.0,
    }


def pack_corpus(prefixes: list[str | Path], out: str | Path, seq_len: int, algo: str = "bfd", *,
                seed: int = 0, overflow: str = "split", shuffle: bool = True,
                shard_size: int = 1 << 27, max_depth: int | None = None,
                time_limit: float | None = None,
                overwrite: bool = False, progress: bool = False) -> PackResult:
    """Pack token files into a packed dataset directory ``out``."""
    t0 = time.perf_counter()
    if algo not in PACKERS:
        raise PacktoolError(f"unknown --algo {algo!r}; choose one of {', '.join(PACKERS)}")
    if seq_len < 1:
        raise PacktoolError(f"--seq-len must be positive, got {seq_len}")
    if shard_size < 1:
        raise PacktoolError(f"--shard-size must be positive, got {shard_size}")
    corpora = open_sources(prefixes)
    out_dir = Path(out).resolve()
    for c in corpora:
        if out_dir == c.prefix.resolve().parent or out_dir in c.prefix.resolve().parents:
            raise PacktoolError(f"--out {out} contains the source {c.prefix}; write the packed "
                                "dataset to a directory of its own")
    doc_base = np.cumsum([0] + [len(c) for c in corpora]).astype(np.int64)
    lengths = np.concatenate([c.lengths for c in corpora]) if corpora else np.empty(0, np.int64)
    segs = make_segments(lengths, seq_len, overflow)
    accepted = packer_options(algo)
    options = {"max_depth": max_depth} if "max_depth" in accepted else {}
    if "time_limit" in accepted and time_limit is not None:
        options["time_limit"] = time_limit
    t_assign = time.perf_counter()
    solver_info: dict = {}
    packs = assign_packs(segs.length, seq_len, algo, seed, **options,
                         **({"info": solver_info} if "info" in accepted else {}))
    assign_seconds = time.perf_counter() - t_assign
    n_packs = int(packs.max()) + 1 if packs.size else 0
    rank = (np.random.default_rng(seed).permutation(n_packs) if shuffle
            else np.arange(n_packs)).astype(np.int64)
    order, pack_nseg = _order_segments(packs, rank, n_packs)
    seg_len = segs.length[order]
    seg_doc = segs.doc[order]
    seg_off = segs.offset[order]
    del packs, order
    seg_ends = np.cumsum(seg_len)
    seg_first = np.concatenate([[0], np.cumsum(pack_nseg)]).astype(np.int64)
    pack_tok_end = seg_ends[seg_first[1:] - 1] if n_packs else np.empty(0, np.int64)
    pack_len = np.diff(np.concatenate([[0], pack_tok_end]))
    if n_packs and int(pack_len.max()) > seq_len:  # a packer bug must never reach disk
        raise RuntimeError(f"packer {algo} produced a pack of {int(pack_len.max())} > {seq_len}")

    # shard boundaries: start a new shard once a shard holds >= shard_size tokens
    shard_starts = [0]
    if n_packs:
        cum = np.concatenate([[0], pack_tok_end])
        while True:
            p0 = shard_starts[-1]
            p1 = int(np.searchsorted(cum, cum[p0] + shard_size, side="left"))
            p1 = max(p1, p0 + 1)
            if p1 >= n_packs:
                break
            shard_starts.append(p1)
    shard_starts.append(n_packs)

    tok_dtype = max((c.dtype for c in corpora), key=lambda d: d.itemsize)
    has_mask = any(c.mask is not None for c in corpora)
    dtypes = array_dtypes(seq_len, tok_dtype)
    # map each global document to its corpus and its token start there
    which = np.searchsorted(doc_base, seg_doc, side="right") - 1
    starts = [np.asarray(c.starts, dtype=np.int64) for c in corpora]

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=segs.counts["n_tokens"], unit="tok", unit_scale=True, desc="pack",
                   dynamic_ncols=True, mininterval=0.5)
    shards = []
    try:
        with atomic_dir(Path(out), overwrite, owned_marker=INDEX) as tmp:
            for k in range(len(shard_starts) - 1):
                p0, p1 = shard_starts[k], shard_starts[k + 1]
                shards.append(_write_shard(
                    tmp, k, p0, p1, seg_first, seg_len, seg_doc, seg_off, which, doc_base,
                    starts, pack_nseg, corpora, dtypes, bar, has_mask))
            n_tokens = segs.counts["n_tokens"]
            stats = pack_stats(n_tokens, n_packs, segs.counts["n_segments"], seq_len,
                               segs.length, solver_info.get("lp_bound"))
            index = {
                "format": FORMAT,
                "version": VERSION,
                "seq_len": seq_len,
                "algo": algo,
                "algo_options": options,
                "seed": seed,
                "shuffle": shuffle,
                "overflow": overflow,
                "token_dtype": dtypes["tokens"].name,
                "loss_mask": has_mask,
                "dtypes": {k: v.str for k, v in dtypes.items()},
                "n_packs": n_packs,
                **segs.counts,
                **stats,
                "solver": {k: v for k, v in solver_info.items() if k != "packs"},
                "sources": [_source_entry(c) for c in corpora],
                "shards": shards,
                "created_by": f"packtool {__version__}",
            }
            index["index_sha256"] = index_digest(index)
            (tmp / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    finally:
        if bar is not None:
            bar.close()
    return PackResult(
        out=str(out), algo=algo, seq_len=seq_len, n_packs=n_packs, n_tokens=n_tokens,
        n_segments=segs.counts["n_segments"], efficiency=stats["efficiency"],
        lower_bound_packs=stats["lower_bound_packs"], gap_percent=stats["gap_percent"],
        packing_factor=stats["packing_factor"], counts=segs.counts,
        bounds={k: stats[k] for k in ("l2_bound_packs", "lp_bound_packs", "best_bound_packs",
                                       "gap_to_best_bound_percent")},
        seconds=time.perf_counter() - t0, assign_seconds=assign_seconds, n_shards=len(shards),
    )


def _source_entry(c: TokenCorpus) -> dict:
    manifest = prefix_paths(c.prefix)["json"]
    return {
        "prefix": str(c.prefix),
        "manifest_sha256": sha256_file(manifest),
        "n_docs": len(c),
        "n_tokens": c.n_tokens,
        "dtype": c.dtype.name,
        "tokenizer_sha256": c.meta["tokenizer"]["sha256"],
        "checksums": c.meta["checksums"],
    }


def _write_shard(tmp, k, p0, p1, seg_first, seg_len, seg_doc, seg_off, which, doc_base,
                 starts, pack_nseg, corpora, dtypes, bar, has_mask=False) -> dict:
    """Write one shard. Per-token arrays are filled in place through memory maps, a chunk of
    whole packs at a time, by two threads (numba kernels and crc32 release the GIL): one
    gathers tokens (and the loss mask), the other writes positions and segment ids."""
    s0, s1 = int(seg_first[p0]), int(seg_first[p1])
    lens = seg_len[s0:s1]
    n_tok = int(lens.sum())
    nseg = pack_nseg[p0:p1]
    seg_in_shard = np.concatenate([[0], np.cumsum(nseg)]).astype(np.int64)
    tok_ends = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    pack_offsets = tok_ends[seg_in_shard]
    # per pack cu_seqlens back to back: pack j's are cu[seg_in_shard[j] + j : ... + 1]
    cu = np.empty((s1 - s0) + (p1 - p0), np.int64)
    idx = np.arange(s1 - s0) + np.repeat(np.arange(p1 - p0), nseg) + 1
    cu[idx] = tok_ends[1:] - np.repeat(pack_offsets[:-1], nseg)
    cu[seg_in_shard[:-1] + np.arange(p1 - p0)] = 0
    name = f"shard-{k:05d}"
    small = {"pack_offsets": pack_offsets, "seg_offsets": seg_in_shard, "cu_seqlens": cu,
             "source_docs": seg_doc[s0:s1], "source_offsets": seg_off[s0:s1]}
    files = {}
    for a, arr in small.items():
        w = NpyWriter(tmp / f"{name}.{a}.npy", dtypes[a], arr.size)
        w.write(arr)
        files[a] = {"name": f"{name}.{a}.npy", **w.close()}
    per_token = ("tokens", "position_ids", "doc_ids") + ((MASK,) if has_mask else ())
    maps = {a: NpyMap(tmp / f"{name}.{a}.npy", dtypes[a], n_tok) for a in per_token}
    sdoc, soff, swhich = seg_doc[s0:s1], seg_off[s0:s1], which[s0:s1]

    def tokens_part(a, b, t_a, t_b):
        toks = maps["tokens"].array
        mask = maps[MASK].array if has_mask else None
        if mask is not None:
            mask[t_a:t_b] = 1
        for c, corpus in enumerate(corpora):
            m = swhich[a:b] == c
            if not m.any():
                continue
            src = starts[c][sdoc[a:b][m] - doc_base[c]] + soff[a:b][m]
            dst = tok_ends[a:b][m]
            _gather(corpus.tokens, src, lens[a:b][m], toks, dst)
            if mask is not None and corpus.mask is not None:
                _gather(corpus.mask, src, lens[a:b][m], mask, dst)
        maps["tokens"].hash_upto(t_b)
        if mask is not None:
            maps[MASK].hash_upto(t_b)

    def sidecars_part(j, j1, a, b, t_a, t_b):
        _fill_sidecars(lens[a:b], nseg[j:j1], maps["position_ids"].array[t_a:t_b],
                       maps["doc_ids"].array[t_a:t_b])
        maps["position_ids"].hash_upto(t_b)
        maps["doc_ids"].hash_upto(t_b)

    try:
        with ThreadPoolExecutor(2, "packtool-shard") as pool:
            j, n_packs = 0, p1 - p0
            while j < n_packs:
                j1 = int(np.searchsorted(pack_offsets, pack_offsets[j] + CHUNK_TOKENS, side="right")) - 1
                j1 = min(max(j1, j + 1), n_packs)
                a, b = int(seg_in_shard[j]), int(seg_in_shard[j1])
                t_a, t_b = int(pack_offsets[j]), int(pack_offsets[j1])
                jobs = [pool.submit(tokens_part, a, b, t_a, t_b),
                        pool.submit(sidecars_part, j, j1, a, b, t_a, t_b)]
                for f in jobs:
                    f.result()
                if bar is not None:
                    bar.update(t_b - t_a)
                j = j1
        for a, m in maps.items():
            files[a] = {"name": f"{name}.{a}.npy", **m.close()}
    except BaseException:
        for m in maps.values():
            m.abort()
        raise
    return {"name": name, "n_packs": p1 - p0, "n_tokens": n_tok, "n_segments": s1 - s0,
            "files": {a: files[a] for a in (*ARRAYS, MASK) if a in files}}
