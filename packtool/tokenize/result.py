"""What a tokenize run reports (:class:`TokenizeResult`), and how the parts' engine records
merge into the corpus's (:func:`merge_engines`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class TokenizeResult:
    prefix: str
    n_docs: int
    n_tokens: int
    n_empty: int
    n_skipped: int
    dtype: str
    seconds: float
    inputs: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    n_parts: int = 1
    n_parts_skipped: int = 0        # parts found finished and verified (resume)
    executor: str = "local"
    engine: dict = field(default_factory=dict)  # what ran, and why faster ones did not
    n_tokens_tokenized: int | None = None  # by this run (skipped parts excluded); None: all
    published: str = ""   # an object-store output: what was uploaded (packtool.storage)
    groups: dict | None = None  # pairs and groups: {kind, n_groups, n_sequences}
    images: dict | None = None  # --vision: {n_images, n_vision_tokens}

    def _counted(self) -> str:
        """What the corpus holds: documents, or a grouped corpus's groups and sequences (a
        record is a group; each of its completions one sequence, a document of the files)."""
        if self.images:
            return (f"{self.n_docs:,} documents with {self.images['n_images']:,} images "
                    f"({self.images['n_vision_tokens']:,} image tokens)")
        if not self.groups:
            return f"{self.n_docs:,} documents"
        what = "pairs" if self.groups["kind"] == "pairs" else "groups of completions"
        return f"{self.groups['n_groups']:,} {what}, {self.groups['n_sequences']:,} sequences"

    @property
    def tokens_per_second(self) -> float:
        done = self.n_tokens if self.n_tokens_tokenized is None else self.n_tokens_tokenized
        return done / self.seconds if self.seconds else 0.0

    def engine_text(self) -> str:
        e = self.engine
        if not e or "name" not in e:
            return ""
        text = f"; engine {e['name']} {e.get('version', '')}".rstrip()
        if e.get("checked_docs") is not None:
            text += (f" ({e['checked_docs']:,} {'sequences' if self.groups else 'documents'}"
                     " checked against "
                     f"{e.get('reference') or 'tokenizers'}: identical)")
        if e.get("not_used"):
            text += "; not used: " + "; ".join(f"{k}: {v}" for k, v in e["not_used"].items())
        if e.get("fallback"):
            text += f"; fell back to the reference: {e['fallback']}"
        return text

    def summary(self, warnings: bool = True) -> str:
        """What the run did; ``warnings``: with its warnings (the CLI prints them on stderr)."""
        skipped = f", {self.n_skipped:,} bad records skipped" if self.n_skipped else ""
        if self.executor == "finalize":
            return (f"{self.prefix}: {self._counted()}, {self.n_tokens:,} tokens "
                    f"({self.dtype}) in {self.n_parts} parts, every part checked (sha256); "
                    f"manifest written in {self.seconds:.1f}s")
        return (
            f"{self.prefix}: {self._counted()}, {self.n_tokens:,} tokens ({self.dtype}), "
            f"{self.n_empty:,} empty{skipped} in {self.seconds:.1f}s "
            f"({self.tokens_per_second / 1e6:.2f}M tokens/s tokenized)"
            + (f"; {self.n_parts} parts ({self.executor})" if self.n_parts > 1 else "")
            + (f", {self.n_parts_skipped} already finished and verified, skipped"
               if self.n_parts_skipped else "")
            + self.engine_text()
        ) + (f"\n{self.published}" if self.published else "") + "".join(
            f"\nwarning: {w}" for w in (self.warnings if warnings else []))

    def to_json(self) -> dict:
        d = asdict(self)
        d["tokens_per_second"] = self.tokens_per_second
        return d


def group_counts(kind: str | None, entries: list[dict]) -> dict | None:
    """A grouped run's ``groups`` from its parts' entries (None for documents)."""
    if kind is None:
        return None
    return {"kind": kind, "n_groups": sum(e.get("n_groups", 0) for e in entries),
            "n_sequences": sum(e["n_docs"] for e in entries)}


def eos_note(opts) -> list[str]:
    """One line when documents get no end token (no --eos; a chat template places its own):
    nothing is wrong with the corpus, but a trainer reading it as one flat stream (Megatron's
    --reset-attention-mask, llm.c) cannot tell where a document ends (docs/EXPORT.md)."""
    if opts.eos is not None or opts.mode == "messages":
        return []
    if opts.group_kind:  # no flat-stream export takes pairs or groups (packtool.export)
        return ["no --eos: completions do not end with an end-of-text token, so no sequence's "
                "log-probability scores where it stops. Pass --eos TOKEN (e.g. "
                "'<|endoftext|>')"]
    what = "documents" if opts.mode == "text" else "completions"
    return [f"no --eos: {what} do not end with an end-of-text token, so in a flat stream "
            "(export --format megatron or llmc) nothing separates them; packtool's packs keep "
            "the boundaries anyway. Pass --eos TOKEN (e.g. '<|endoftext|>') if a trainer "
            "needs one"]


def merge_engines(engines: list[dict]) -> dict:
    """One ``engine`` entry for the corpus: what ran (the same everywhere, else per part) and
    the checks summed over the parts."""
    keys = ("name", "version", "requested", "check")
    if any(tuple(e.get(k) for k in keys) != tuple(engines[0].get(k) for k in keys)
           for e in engines):
        return {"per_part": engines}
    out = {k: engines[0].get(k) for k in keys}
    out.update({k: engines[0][k] for k in ("reference", "family") if k in engines[0]})
    if "checked_docs" in engines[0]:
        out["checked_docs"] = sum(e.get("checked_docs", 0) for e in engines)
        out["checked_tokens"] = sum(e.get("checked_tokens", 0) for e in engines)
        out["result"] = "identical"
    reasons: dict = {}
    for e in engines:  # engine name -> why it was not used (the same for every part, mostly)
        for name, why in (e.get("not_used") or {}).items():
            reasons.setdefault(name, why)
    if reasons:
        out["not_used"] = reasons
    fallbacks = [f"part {i}: {e['fallback']}" for i, e in enumerate(engines)
                 if e.get("fallback")]
    if fallbacks:
        out["fallback"] = "; ".join(fallbacks)
    return out
