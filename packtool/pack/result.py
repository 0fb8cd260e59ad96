"""What ``pack`` reports: counts, figures, the mixture and the held-out split."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..metrics import bounds_text


@dataclass
class PackResult:
    out: str
    algo: str
    seq_len: int
    n_packs: int
    n_tokens: int
    n_segments: int
    counts: dict
    metrics: dict
    solver: dict
    seconds: float
    assign_seconds: float
    n_shards: int
    sources_verified: bool
    layout: str = "index"
    sources: list[dict] = field(default_factory=list)   # per source: factor, used, share
    valid: dict | None = None                           # the held-out split's counts
    warnings: list[str] = field(default_factory=list)
    published: str = ""   # an object-store output: what was uploaded (packtool.storage)

    @property
    def efficiency(self) -> float:
        return self.metrics["efficiency"]

    @property
    def packing_factor(self) -> float:
        return self.metrics["packing_factor"]

    def summary(self) -> str:
        c = self.counts
        over = []
        if c["n_split"]:
            over.append(f"split {c['n_split']:,} docs into {c['n_split_pieces']:,} pieces")
        if c["n_truncated"]:
            over.append(f"truncated {c['n_truncated']:,} docs "
                        f"(-{c['n_truncated_tokens']:,} tokens)")
        if c["n_dropped"]:
            over.append(f"dropped {c['n_dropped']:,} docs ({c['n_dropped_tokens']:,} tokens)")
        if c["n_empty"]:
            over.append(f"skipped {c['n_empty']:,} empty docs")
        m = self.metrics
        lines = [
            f"{self.out}: {self.n_packs:,} packs of {self.seq_len:,} ({self.algo}), "
            f"{self.n_tokens:,} tokens, efficiency {100 * m['efficiency']:.3f}%, "
            f"{bounds_text(m)}, packing factor {m['packing_factor']:.2f}"
            + ("; " + "; ".join(over) if over else "")
            + f"; {self.n_shards} shard(s), {self.layout} layout, in {self.seconds:.2f}s "
            f"(assignment {self.assign_seconds:.2f}s)"
            + ("; source checksums verified" if self.sources_verified
               else "; the sources' token files are verified by readers on first read"
               if self.layout == "index" else "")]
        if len(self.sources) > 1 or any(src["factor"] != 1 for src in self.sources):
            lines += [f"  {src['prefix']}: x{src['factor']:g}: {src['docs_used']:,} of "
                      f"{src['n_docs']:,} documents, {src['tokens_used']:,} tokens = "
                      f"{100 * src['token_share']:.2f}% of the packed tokens"
                      for src in self.sources]
        if self.valid:
            v = self.valid
            lines.append(f"  held out: {v['n_docs_held_out']:,} documents -> {v['path']}: "
                         f"{v['n_packs']:,} packs, {v['n_tokens']:,} tokens")
        lines += [self.published] if self.published else []
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(d.pop("metrics"))  # efficiency, bounds, gaps at the top level, as in index.json
        return d


