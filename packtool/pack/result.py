"""What ``pack`` reports: counts, figures, the mixture and the held-out split."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..metrics import bounds_text

# --overflow split cutting more than this share of the documents is worth a warning: at a
# --seq-len chosen for the corpus a few long documents are split (the bundled corpus, 1,220
# documents: 0.2% at L=2,048, 7.6% at 512), while 43% (at 128) means it was not
SPLIT_WARN_SHARE = 0.10


def split_warning(counts: dict, seq_len: int) -> list[str]:
    """A warning (with the figures and the fix) when --overflow split cut more than
    SPLIT_WARN_SHARE of the documents packed (copies counted as documents)."""
    n_split = counts.get("n_split", 0)
    placed = counts.get("n_segments", 0) - counts.get("n_split_pieces", 0) + n_split
    if not n_split or n_split <= SPLIT_WARN_SHARE * placed:
        return []
    return [f"--overflow split cut {n_split:,} of {placed:,} documents "
            f"({100 * n_split / placed:.1f}%, more than {100 * SPLIT_WARN_SHARE:g}%) into "
            f"{counts['n_split_pieces']:,} pieces of at most {seq_len:,} tokens: every piece "
            "after a document's first is trained without what came before it; if --seq-len "
            "was not chosen for this, raise it (packtool stats PREFIX shows the length "
            "percentiles) or use --overflow truncate or drop"]


# --overflow truncate/drop discarding more than this share of the tokens is worth a warning:
# a new user's `pack -L 64 --overflow truncate` kept 108,972 of 10,855,249 tokens (1%) with
# only a count in the summary; at a --seq-len chosen for the corpus it is a few percent
DISCARD_WARN_SHARE = 0.10


def discard_warning(counts: dict, n_tokens: int, seq_len: int,
                    groups: dict | None = None) -> list[str]:
    """A warning (the share and the fix) when --overflow truncate or drop threw away more
    than DISCARD_WARN_SHARE of the tokens of the documents packed; ``n_tokens``: the tokens
    kept; ``groups``: index.json's entry of pairs and groups, which --overflow split cannot
    keep (a group is never cut), so the fix offered is a larger --seq-len or a shared
    prompt."""
    cut, dropped = counts.get("n_truncated_tokens", 0), counts.get("n_dropped_tokens", 0)
    total = n_tokens + cut + dropped
    if not total or cut + dropped <= DISCARD_WARN_SHARE * total:
        return []
    how = " and ".join(x for x, n in (("--overflow truncate", cut), ("--overflow drop", dropped))
                       if n) or "--overflow"
    return [f"{how} discarded {cut + dropped:,} of {total:,} tokens "
            f"({100 * (cut + dropped) / total:.1f}%, more than {100 * DISCARD_WARN_SHARE:g}%; "
            f"{n_tokens:,} kept) at --seq-len {seq_len:,}: "
            + (("raise --seq-len" + ("" if groups["share_prompt"] else " or pass --share-prompt")
                + " to keep them (a group is never cut; " if groups else
                "use --overflow split to keep them, or a larger --seq-len (")
               + "packtool stats PREFIX shows the length percentiles)")]


def holdout_warning(valid: dict | None, sources: list[dict]) -> list[str]:
    """A warning when the held-out split takes most of the documents (--valid-fraction 0.9
    for 0.09, say): the run did what was asked, but the training set is the smaller part."""
    total = sum(int(s.get("n_docs", 0)) for s in sources)
    held = int((valid or {}).get("n_docs_held_out") or 0)
    if not total or held <= total / 2:
        return []
    return [f"{held:,} of {total:,} documents ({100 * held / total:.1f}%) are held out for "
            f"validation; training keeps {total - held:,}: if that was not meant, lower "
            "--valid-fraction or --valid-docs"]


def vsl_lines(v: dict, n_tokens: int) -> list[str]:
    """A --vsl dataset's rows per slot length and its remnant rows, for the summaries."""
    rows = ", ".join(f"{int(k):,}: {n:,}" for k, n in sorted(v["rows"].items(),
                                                             key=lambda kv: int(kv[0])))
    share = 100 * v["n_remnant_tokens"] / max(n_tokens, 1)
    return [f"  vsl {v['min']}:{v['max']}: chunk rows per length {{{rows}}}; "
            f"{v['n_remnant_rows']:,} remnant rows of {v['min']:,} holding "
            f"{v['n_remnant_tokens']:,} tokens ({share:.2f}% of the tokens); slots "
            f"{100 * n_tokens / max(v['n_slot_tokens'], 1):.2f}% full"]


def run_warnings(res, seq_len: int) -> list[str]:
    """What a finished pack run warns about, from what it did (--vsl cuts documents by
    design: no warning that it split them)."""
    return ([] if res.vsl else split_warning(res.counts, seq_len)
            + discard_warning(res.counts, res.n_tokens, seq_len, res.groups)
            + holdout_warning(res.valid, res.sources))


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
    #                                                     (and target_share: PREFIX=SHARE)
    valid: dict | None = None                           # the held-out split's counts
    warnings: list[str] = field(default_factory=list)
    published: str = ""   # an object-store output: what was uploaded (packtool.storage)
    vsl: dict | None = None  # --vsl: index.json's vsl entry (rows per length, remnants)
    overflow: str = ""       # index.json's: the policy done (pairs and groups: refuse or drop)
    groups: dict | None = None  # pairs and groups: index.json's groups entry
    trees: dict | None = None   # prefix trees: index.json's trees entry

    @property
    def efficiency(self) -> float:
        return self.metrics["efficiency"]

    @property
    def packing_factor(self) -> float:
        return self.metrics["packing_factor"]

    def summary(self, warnings: bool = True) -> str:
        """What the run did; ``warnings``: with its warnings (the CLI prints them on stderr)."""
        c = self.counts
        over = []
        if c["n_split"]:
            over.append(f"split {c['n_split']:,} docs into {c['n_split_pieces']:,} pieces")
        if c["n_truncated"]:
            over.append(f"truncated {c['n_truncated']:,} docs "
                        f"(-{c['n_truncated_tokens']:,} tokens)")
        if c["n_dropped"] and self.groups:  # a group is dropped whole, never cut
            unit = "pairs" if self.groups["kind"] == "pairs" else "groups"
            over.append(f"dropped {self.groups['n_dropped_groups']:,} {unit} over --seq-len "
                        f"({c['n_dropped']:,} sequences, "
                        f"{c['n_dropped_tokens']:,} tokens)")
        elif c["n_dropped"]:
            over.append(f"dropped {c['n_dropped']:,} docs ({c['n_dropped_tokens']:,} tokens)")
        if c["n_empty"]:
            over.append(f"skipped {c['n_empty']:,} empty docs")
        if t := self.trees:
            kept, flat = t["n_tokens_stored"], t["n_tokens_flat"]
            over.append(f"prefix trees: {kept:,} tokens stored of {flat:,} "
                        f"({flat / max(kept, 1):.2f}x fewer) in {t['n_trees']:,} trees")
        if c.get("n_align_tokens") is not None:
            over.append(f"segments aligned: {c['n_align_tokens']:,} pad tokens "
                        f"({100 * c['n_align_tokens'] / max(self.n_tokens, 1):.2f}%)")
        m = self.metrics
        head = (f"{self.n_packs:,} packs of {self.seq_len:,} ({self.algo}), "
                f"{self.n_tokens:,} tokens, efficiency {100 * m['efficiency']:.3f}%, "
                f"{bounds_text(m)}, packing factor {m['packing_factor']:.2f}") if not self.vsl \
            else (f"{self.n_packs:,} rows of {self.vsl['min']:,} to {self.vsl['max']:,} tokens "
                  f"(--vsl), {self.n_tokens:,} tokens")
        lines = [
            f"{self.out}: {head}" + ("; " + "; ".join(over) if over else "")
            + f"; {self.n_shards} shard(s), {self.layout} layout, in {self.seconds:.2f}s "
            f"(assignment {self.assign_seconds:.2f}s)"
            + ("; source checksums verified" if self.sources_verified
               else "; the sources' token files are verified by readers on first read"
               if self.layout == "index" else "")]
        if len(self.sources) > 1 or any(src["factor"] != 1 for src in self.sources):
            lines += [f"  {src['prefix']}: x{src['factor']:g}: {src['docs_used']:,} of "
                      f"{src['n_docs']:,} documents, {src['tokens_used']:,} tokens = "
                      f"{100 * src['token_share']:.2f}% of the packed tokens"
                      + (f" (target {100 * src['target_share']:.2f}%)"
                         if "target_share" in src else "")
                      for src in self.sources]
        if self.valid:
            v = self.valid
            lines.append(f"  held out: {v['n_docs_held_out']:,} documents -> {v['path']}: "
                         f"{v['n_packs']:,} packs, {v['n_tokens']:,} tokens")
        lines += [self.published] if self.published else []
        lines += vsl_lines(self.vsl, self.n_tokens) if self.vsl else []
        lines += [f"warning: {w}" for w in self.warnings] if warnings else []
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(d.pop("metrics"))  # efficiency, bounds, gaps at the top level, as in index.json
        return d


