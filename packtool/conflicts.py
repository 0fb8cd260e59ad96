"""Which features combine: every pair (or set) of features that cannot be used together,
declared once, as data, with why and the fix. ``pack``'s options, ``stats``, ``export``,
the readers (``pad_to``, ``pad_multiple``, ``per_segment``), the collators (``max_docs``),
``cp_shard``, ``model_inputs`` and the docs (docs/PIPELINE.md, "Which options combine",
tested equal to :func:`markdown`) all read this table: a combination not in it is exact
(tests/test_combinations.py walks them), one in it is refused by :func:`check`, naming the
conflict::

    check({"vsl", "align"})   # PacktoolError: --vsl x alignment: a --vsl chunk row is ...

A feature is a short name (:data:`FEATURES` says how a user spells it). Nothing of packtool is
imported here but its errors, so every layer can ask.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import PacktoolError

FEATURES = {  # name -> how a user turns it on
    "vsl": "--vsl",
    "align": "alignment (--align/--cp/--tp --sequence-parallel/--fp8)",
    "max_docs": "--max-docs",
    "algo": "--algo other than bfd",
    "packer_limits": "--max-depth/--work-limit/--time-limit",
    "truncate": "--overflow truncate",
    "drop": "--overflow drop",
    "group_docs": "--group-docs",
    "balance": "--balance attention",
    "groups": "pairs and groups (tokenize --chosen-field/--completions-field)",
    "plain": "plain documents (tokenized without --chosen-field/--completions-field)",
    "share_prompt": "--share-prompt",
    "share_prefix": "--share-prefix",
    "mixture": "repeat factors or target shares (PREFIX:FACTOR, PREFIX=SHARE)",
    "holdout": "--valid-docs/--valid-fraction",
    "per_segment": "per_segment=True (padding every segment)",
    "row_pad": "collate pad_multiple without per_segment (a row pad segment)",
    "collate_max_docs": "collate max_docs=K",
    "varlen": "cu_seqlens attention (flash-attention varlen, model_inputs varlen=True)",
    "cp_shard": "cp_shard (context parallelism at load)",
    "cp_zigzag": "cp_shard mode='zigzag' (TE's THD layout)",
    "shared_rows": "rows of shared prefixes (--share-prompt, --share-prefix)",
    "export_segments": "export as segments (megatron, llmc, parquet-packed, mds)",
    "images": "images (tokenize --vision)",
    "layout_tokens": "--layout tokens",
}


@dataclass(frozen=True)
class Conflict:
    features: tuple[str, ...]  # all of them in use together: refused
    why: str
    fix: str

    @property
    def name(self) -> str:
        return " x ".join(FEATURES[f].split(" (")[0] for f in self.features)

    def message(self) -> str:
        return f"{self.name}: {self.why}; {self.fix}"


_WHOLE = "pairs and groups are packed whole, one item a group"
_TREE_ROW = ("a row of segments says 'attend within your own segment', so a tree's segment "
             "would lose its ancestors, and positions would restart where a child's continue")
CONFLICTS = (
    Conflict(("vsl", "align"), "a --vsl chunk row is one unpadded segment and remnant rows are "
             "bfd's: there are no pads to align", "drop the alignment options, or --vsl"),
    Conflict(("vsl", "max_docs"), "a --vsl remnant row is bfd's, with no cap on its segments",
             "drop --max-docs, or --vsl"),
    Conflict(("vsl", "algo"), "--vsl packs its remnants with bfd (as Dataset Decomposition "
             "does) and every chunk alone", "drop --algo"),
    Conflict(("vsl", "packer_limits"), "--vsl packs with bfd, which takes no packer limits",
             "drop them"),
    Conflict(("vsl", "truncate"), "--vsl cuts every document into chunks, none is truncated",
             "drop --overflow"),
    Conflict(("vsl", "drop"), "--vsl cuts every document into chunks, none is dropped",
             "drop --overflow"),
    Conflict(("vsl", "group_docs"), "--vsl cuts the whole corpus in one plan",
             "drop --group-docs"),
    Conflict(("vsl", "balance"), "a --vsl row's cost follows its length", "drop --balance; "
             "batch rows of one length instead (the sampler's tokens_per_step)"),
    Conflict(("groups", "vsl"), f"{_WHOLE}, and --vsl cuts sequences into chunks",
             "drop --vsl"),
    Conflict(("groups", "align"), f"{_WHOLE}, and alignment pads would fall inside a group "
             "(not supported yet)", "drop the alignment options"),
    Conflict(("groups", "max_docs"), f"{_WHOLE}, and a group's sequences count as segments "
             "(not supported yet)", "drop --max-docs"),
    Conflict(("groups", "group_docs"), f"{_WHOLE}, in one plan", "drop --group-docs"),
    Conflict(("groups", "mixture"), f"{_WHOLE}, each once", "drop the factors and shares"),
    Conflict(("groups", "holdout"), f"{_WHOLE}; hold out records before tokenize",
             "drop --valid-docs/--valid-fraction"),
    Conflict(("groups", "truncate"), "a pair or group is never cut (a sequence without its "
             "end, or a prompt without its completions)", "keep the default (over-long groups "
             "refused) or pass --overflow drop (dropped and counted)"),
    Conflict(("plain", "share_prompt"), "--share-prompt shares the prompt of pairs and groups",
             "drop --share-prompt, or tokenize with --chosen-field/--rejected-field or "
             "--completions-field"),
    Conflict(("groups", "per_segment"), "padding each segment would cut into a group's "
             "sequences (seq_ids, completion_mask per token)", "pad grouped rows at the row's "
             "end (pad_to or pad_multiple without per_segment)"),
    Conflict(("collate_max_docs", "row_pad"), "max_docs fixes cu_seq_lens's length, and a "
             "row pad would add a segment to some batches only", "pad every pack instead "
             "(TorchPackedDataset(pad_to=seq_len), one pad segment each) and pass max_docs="
             "--max-docs + 1, or use per_segment=True"),
    Conflict(("images", "groups"), "a pair's or group's prompt is encoded once and copied "
             "before each completion, and its images would need the same (not supported yet)",
             "tokenize the prompts with images as prompt/completion or chat records"),
    Conflict(("images", "vsl"), "--vsl cuts documents into chunks at fixed lengths, which "
             "would cut an image's tokens apart from its pixels and its 3-D positions",
             "drop --vsl"),
    Conflict(("images", "layout_tokens"), "a row's images are read through its segments' "
             "source documents (their references, grids and 3-D positions), and --layout "
             "tokens makes shards meant to outlive the corpus", "keep the default --layout "
             "index"),
    Conflict(("images", "align"), "alignment pads inside a row would need 3-D positions and "
             "image-free pads (not supported yet)", "drop the alignment options"),
    Conflict(("images", "group_docs"), "the caps and the image checks run over the whole "
             "corpus plan (not supported yet)", "drop --group-docs"),
    Conflict(("images", "cp_shard"), "a rank's share of the row would cut images' tokens away "
             "from their pixels and leave the 3-D positions whole (not supported yet)",
             "train rows with images without context parallelism"),
    Conflict(("images", "truncate"), "a truncated document can end inside an image's tokens, "
             "and the model needs all of them for its pixels", "use --overflow drop (over-long "
             "documents dropped and counted) or raise --seq-len"),
    Conflict(("shared_rows", "varlen"), "a segment attends to its ancestors (a completion to "
             "its prompt) and itself, which cu_seqlens (and masks inferred from position_ids) "
             "cannot express", "pass mask='4d' (eager/sdpa attention) or use "
             "packtool.torch.block_mask(batch) with FlexAttention"),
    Conflict(("shared_rows", "cp_zigzag"), "a segment's keys are its ancestors' (a completion's, "
             "its prompt's) and its own, and TE's THD attention runs within one segment",
             "use cp_shard(..., mode='balanced'), whose pieces key their ancestors "
             "(key_positions), or pack without sharing"),
    Conflict(("share_prompt", "export_segments"), "a row of segments says 'attend within your "
             "own segment', so a completion would lose its prompt, and positions would restart "
             "where a completion's continue from its prompt", "export --format parquet (it "
             "carries seg_up, the tree), train from the packed dataset with packtool.torch "
             "(block_mask, sequence_logps), or pack without --share-prompt"),
    Conflict(("share_prefix", "images"), "every image's tokens are the same image-pad id, so "
             "a trie over token ids would take two different images for one shared prefix",
             "pack records with images without --share-prefix"),
    Conflict(("share_prefix", "share_prompt"), "--share-prefix already shares every group's "
             "prompt (and any longer common beginning)", "drop --share-prompt"),
    Conflict(("share_prefix", "export_segments"), _TREE_ROW, "export --format parquet (it "
             "carries seg_up, the tree), or train from the packed dataset with packtool.torch"),
    Conflict(("share_prefix", "vsl"), "a tree is packed whole, and --vsl cuts sequences into "
             "chunks", "drop --vsl"),
    Conflict(("share_prefix", "align"), "alignment pads would fall inside a tree's path (its "
             "positions continue from the parent's end; not supported yet)",
             "drop the alignment options"),
    Conflict(("share_prefix", "max_docs"), "a tree's segments count as segments and a tree is "
             "never cut (not supported yet)", "drop --max-docs"),
    Conflict(("share_prefix", "group_docs"), "records that share a prefix are found over the "
             "whole corpus, in one plan", "drop --group-docs"),
    Conflict(("share_prefix", "mixture"), "each record is a leaf exactly once", "drop the "
             "factors and shares"),
    Conflict(("share_prefix", "holdout"), "a held-out record would leave its tree; hold out "
             "records before tokenize", "drop --valid-docs/--valid-fraction"),
    Conflict(("share_prefix", "truncate"), "a record is never cut (its leaf would end where it "
             "does not)", "keep the default (over-long records refused) or pass --overflow "
             "drop (dropped and counted)"),
    Conflict(("share_prefix", "per_segment"), "padding each segment would move the positions "
             "its children continue from", "pad tree rows at the row's end (pad_to or "
             "pad_multiple without per_segment)"),
)


def conflicts(used) -> list[Conflict]:
    """The table's conflicts among the features ``used`` (names of :data:`FEATURES`)."""
    used = set(used)
    unknown = used - set(FEATURES)
    if unknown:  # a misspelt feature would make every check pass
        raise ValueError(f"unknown features {sorted(unknown)}")
    return [c for c in CONFLICTS if used.issuperset(c.features)]


def check(used, context: str = "") -> None:
    """Refuse ``used`` (feature names) if any of the table's conflicts is among them, naming
    each; ``context`` (e.g. the value at fault) opens the message."""
    found = conflicts(used)
    if found:
        raise PacktoolError((f"{context}: " if context else "")
                            + "; and ".join(c.message() for c in found)
                            + " (docs/PIPELINE.md, 'Which options combine')")


def markdown() -> str:
    """The table as docs/PIPELINE.md shows it (a test keeps them equal)."""
    rows = ["| Together | Why not | Instead |", "|---|---|---|"]
    rows += [f"| {c.name} | {c.why} | {c.fix} |" for c in CONFLICTS]
    return "\n".join(rows)
