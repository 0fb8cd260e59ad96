"""What each stage can be asked to do, as dataclasses: every option's default, its check and
its command-line help are defined once, here, and the CLI (:mod:`packtool.cli.options`) builds
its options from these fields. Importing this module loads nothing heavy (``packtool --help``
builds every command from it).

A field's ``metadata["cli"]`` is plain data: the flags, the help, and a type spec the CLI
turns into a click type (``("int", lo, hi)``, ``("float", lo)``, ``("choice", names)``,
``"flag"``, ``"path"``, ``"str"``); a field without it is library-only.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field, fields

from . import conflicts
from .chat.sandbox import DEFAULT_MAX_RENDER_CHARS as MAX_RENDER_CHARS
from .chat.sandbox import DEFAULT_RENDER_TIMEOUT as RENDER_TIMEOUT
from .errors import PacktoolError
from .sources import DEFAULT_MAX_RECORD_BYTES, MEMORY_PER_RECORD_BYTE, TXT_SPLITS

OVERFLOW = ("split", "truncate", "drop")
LAYOUTS = ("index", "tokens")  # see packtool.formats.packed.schema
SOURCE_CHECKS = ("crc32", "sha256")
BALANCE = ("none", "attention")
# = engines.ENGINE_NAMES (tested)
ENGINES = ("auto", "hf", "sentencepiece", "gigatoken", "fastokens", "tokie")
ENGINE_CHECKS = ("sample", "full", "off")
VISION_RULES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "llava")  # = vision.RULES (tested)
IMAGE_CHECKS = ("sha256", "header")
DEFAULT_PART_BYTES = 256 << 20  # small input files are grouped into parts of about this much
LONG_RECORD_WARN_BYTES = 8 << 20  # the reader warns once per run about a record this large


def opt(default, help: str, *flags: str, type="str", **kw):
    """A field with its command-line form (``flags`` default to ``--field-name``)."""
    return field(default=default,
                 metadata={"cli": {"flags": flags, "help": help, "type": type, **kw}})


def parse_vsl(spec) -> tuple[int, int] | None:
    """(MIN, MAX) of ``--vsl MIN:MAX`` (a string, or a pair from the library), checked:
    powers of two, 1 <= MIN <= MAX < 2**31. None stays None."""
    if spec is None:
        return None
    if isinstance(spec, str):
        lo_s, sep, hi_s = spec.partition(":")
        if not sep or not lo_s.strip().isdigit() or not hi_s.strip().isdigit():
            raise PacktoolError(f"--vsl {spec!r}: give MIN:MAX, two powers of two (e.g. "
                                "--vsl 256:8192)")
        lo, hi = int(lo_s), int(hi_s)
    else:
        try:
            lo, hi = (int(v) for v in spec)
        except (TypeError, ValueError):
            raise PacktoolError(f"vsl={spec!r}: give (MIN, MAX) or 'MIN:MAX'") from None
    for name, v in (("MIN", lo), ("MAX", hi)):
        if v < 1 or v >= 2**31 or v & (v - 1):
            up = 1 << max(int(v) - 1, 0).bit_length()
            raise PacktoolError(f"--vsl {lo}:{hi}: {name} {v:,} is not a power of two from 1 to "
                                f"2**30; use {max(up >> 1, 1):,} or {min(up, 2**30):,}")
    if lo > hi:
        raise PacktoolError(f"--vsl {lo}:{hi}: MIN {lo:,} > MAX {hi:,}; use --vsl {hi}:{lo}")
    return lo, hi


def _ints(section, names, zero_ok=("seed", "pad_id")) -> None:
    """Integer options of ``section`` given as integers (never bool), >= 0 or >= 1."""
    for name in names:
        value = getattr(section, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < (0 if name in zero_ok else 1)):
            raise PacktoolError(f"--{name.replace('_', '-')} must be "
                                + ("an integer >= 0" if name in zero_ok
                                   else "a positive integer") + f", got {value!r}")


def _choices(options) -> None:
    """Every option whose field offers choices (``type=("choice", names)``) is one of them."""
    for f in fields(options):
        cli, value = f.metadata.get("cli", {}), getattr(options, f.name)
        if cli.get("type", ("",))[0] == "choice" and value not in cli["type"][1] and not (
                value is None and f.default is None):  # an optional choice not given
            flag = (cli["flags"] or (f"--{f.name.replace('_', '-')}",))[0]
            raise PacktoolError(f"{flag} {value!r}: choose one of {', '.join(cli['type'][1])}")


@dataclass
class TokenizeOptions:
    """Everything ``tokenize`` is asked to do besides which inputs, tokenizer and output."""

    text_field: str = opt("text", "JSON key / Parquet column with the text; dots reach nested "
                          "keys (meta.body).", show_default=True)
    txt_split: str = opt("file", "How .txt files divide into documents.",
                         type=("choice", TXT_SPLITS), show_default=True)
    skip_bad_records: bool = opt(False, "Skip (and count) records with invalid JSON/UTF-8 or a "
                                 "missing text field.", type="flag")
    bos: str | None = opt(None, "Special token to prepend to every document, e.g. '<s>'.")
    eos: str | None = opt(None, "Special token to append to every document, e.g. '</s>' "
                          "(with --messages-field: after every assistant turn).")
    special_tokens: bool = opt(False, "Apply the tokenizer's own post-processor template (off "
                               "by default).", type="flag")
    workers: int = opt(0, "Tokenizer threads (0 = all cores). Output is identical for any "
                       "value.", "--workers", "-j", type=("int", 0, None), show_default=True)
    batch_size: int = opt(1024, "Documents per tokenizer batch.", type=("int", 1, None),
                          show_default=True)
    batch_bytes: int = 8 << 20  # ... or this many bytes of text, whichever comes first
    overwrite: bool = opt(False, "Replace an existing output (only a packtool output).",
                          type="flag")
    prompt_field: str | None = opt(None, "SFT: key of the prompt (loss is not taken on it).")
    completion_field: str | None = opt(None, "SFT: key of the completion (loss on it).")
    messages_field: str | None = opt(None, "Chat: key of a [{role, content}, ...] list, "
                                     "rendered with the chat template (with --chosen-field or "
                                     "--completions-field: the prompt, rendered with the "
                                     "generation prompt).")
    chosen_field: str | None = opt(None, "Preference pairs: key of the chosen completion "
                                   "(with --rejected-field and --prompt-field or "
                                   "--messages-field).")
    rejected_field: str | None = opt(None, "Preference pairs: key of the rejected completion.")
    completions_field: str | None = opt(None, "Groups (GRPO): key of a list of completions of "
                                        "the prompt.")
    rewards_field: str | None = opt(None, "Groups: key of a list of numbers, one reward per "
                                    "completion.")
    tree_field: str | None = opt(None, "Key of each record's conversation or rollout id (any "
                                 "JSON value): stored per document (.tree), so pack "
                                 "--share-prefix builds one prefix tree of each id's records "
                                 "(docs/FORMAT.md).")
    chat_template: str | None = opt(None, "Jinja chat template file, local (default: "
                                    "tokenizer_config.json's, which a tokenizer at a URL "
                                    "brings; else built-in).", type="path")
    train_on: str = opt("assistant", "Chat: which tokens the loss mask keeps.",
                        type=("choice", ("assistant", "all")), show_default=True)
    max_record_bytes: int = opt(DEFAULT_MAX_RECORD_BYTES, "Largest record in bytes (default "
                                "64 MiB); a larger one is a bad record. Tokenizing a record "
                                f"takes ~{MEMORY_PER_RECORD_BYTE}x its size in memory.",
                                type=("int", 1, None))
    long_record_warn_bytes: int = LONG_RECORD_WARN_BYTES
    max_render_chars: int = opt(MAX_RENDER_CHARS, "Chat: refuse a conversation whose template "
                                "rendering exceeds this size.", type=("int", 1, None),
                                show_default=True)
    render_timeout: float = opt(RENDER_TIMEOUT, "Chat: seconds one template rendering may "
                                "take.", type=("float", 0, True), show_default=True)
    engine: str = opt("auto", "Tokenizer engine: hf = the tokenizers library (the reference "
                      "for a tokenizer.json; for a SentencePiece .model its conversion, "
                      "checked); sentencepiece = the sentencepiece library (the reference for "
                      "a .model); auto = the fastest installed engine for the tokenizer's "
                      "family that matches the reference (pip install 'packtool[fast]').",
                      type=("choice", ENGINES), show_default=True)
    engine_check: str = opt("sample", "Compare a fast engine with the reference on a sample of "
                            "documents (at most 64 KiB + 0.2% of the bytes read), on all of "
                            "them, or not at all (a load-time probe always runs).",
                            type=("choice", ENGINE_CHECKS), show_default=True)
    part_bytes: int = opt(DEFAULT_PART_BYTES, "Group consecutive input files into parts of up "
                          "to this many bytes (a file is never split; 1 = one part per "
                          "file).", type=("int", 1, None), show_default=True)
    vision: str | None = opt(None, "Records with images, counted for this model's processor "
                             "from each image's header (no pixel decoded): image content "
                             "parts, or <image> placeholders with --images-field.",
                             type=("choice", VISION_RULES))
    images_field: str | None = opt(None, "With --vision: key of a list of the record's images "
                                   "(paths relative to the input file, URLs, data: URIs), one "
                                   "a <image> placeholder or image part without a source.")
    min_pixels: int | None = opt(None, "With a Qwen-VL --vision: the processor's min_pixels "
                                 "(default: the model's).", type=("int", 1, None))
    max_pixels: int | None = opt(None, "With a Qwen-VL --vision: the processor's max_pixels "
                                 "(default: the model's).", type=("int", 1, None))
    image_check: str | None = opt(None, "With --vision: how an image is proved the same "
                                  "later: sha256 (its bytes read and hashed; the default) or "
                                  "header (only its header read; its size and mtime, or a "
                                  "store's ETag, recorded; inline images are hashed).",
                                  type=("choice", IMAGE_CHECKS))

    def check(self) -> None:
        """The option checks that need no input or tokenizer: run before a plan is made."""
        if self.max_record_bytes < 1:
            raise PacktoolError(f"--max-record-bytes {self.max_record_bytes}: must be at least "
                                f"1 (default {DEFAULT_MAX_RECORD_BYTES:,})")
        if self.batch_size < 1 or self.workers < 0 or self.part_bytes < 1:
            raise PacktoolError("--batch-size and --part-bytes must be at least 1 and "
                                "--workers at least 0")
        _choices(self)
        named = [(f"--{k.replace('_', '-')}", getattr(self, k)) for k in (
            "prompt_field", "completion_field", "messages_field", "chosen_field",
            "rejected_field", "completions_field", "rewards_field") if getattr(self, k)]
        for i, (a, v) in enumerate(named):
            for b, w in named[i + 1:]:
                if v == w:
                    raise PacktoolError(f"{a} and {b} both name the field {v!r}: each names "
                                        "a different key of the record; give the other one")
        if self.train_on != "assistant" and self.mode != "messages":
            raise PacktoolError(f"--train-on {self.train_on} chooses the trained tokens of a "
                                f"chat (--messages-field); {self.mode.replace('_', '/')} "
                                "records train on their completions only: drop --train-on")
        self._check_vision()
        if self.group_kind:
            self._check_groups()
        elif bool(self.prompt_field) != bool(self.completion_field):
            raise PacktoolError("--prompt-field and --completion-field go together; pass both")
        if self.messages_field and (self.prompt_field or self.completion_field):
            raise PacktoolError("--messages-field cannot be combined with "
                                "--prompt-field/--completion-field")
        if self.messages_field and self.bos:
            raise PacktoolError("with --messages-field the chat template writes the special "
                                "tokens it wants at the start; drop --bos (or put it in the "
                                "template)")
        if self.mode != "text" and self.special_tokens:
            raise PacktoolError("--special-tokens applies to plain text; with "
                                "prompt/completion use --bos/--eos, with messages the chat "
                                "template")

    def _check_vision(self) -> None:
        if not self.vision:
            given = [f"--{k.replace('_', '-')}" for k in ("images_field", "min_pixels",
                                                          "max_pixels", "image_check")
                     if getattr(self, k) is not None]
            if given:
                raise PacktoolError(f"{', '.join(given)} describe images: pass --vision "
                                    f"({', '.join(VISION_RULES)}) or drop them")
            return
        if self.vision == "llava" and (self.min_pixels or self.max_pixels):
            raise PacktoolError("--vision llava gives every image 576 tokens whatever its "
                                "size; drop --min-pixels/--max-pixels")
        if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
            raise PacktoolError(f"--min-pixels {self.min_pixels:,} > --max-pixels "
                                f"{self.max_pixels:,}; swap them")
        if self.group_kind:
            conflicts.check({"images", "groups"})
        if self.tree_field:
            raise PacktoolError("--tree-field names the trees of pack --share-prefix, which "
                                "cannot share records with images (their image tokens are "
                                "alike): drop --tree-field or --vision")

    def _check_groups(self) -> None:
        """Pairs or groups: a prompt (text or chat) and completions, nothing else."""
        if bool(self.chosen_field) != bool(self.rejected_field):
            raise PacktoolError("--chosen-field and --rejected-field go together; pass both")
        if self.chosen_field and self.completions_field:
            raise PacktoolError("--completions-field (a group) and --chosen-field/"
                                "--rejected-field (a pair) are two kinds of record; pass one")
        if bool(self.prompt_field) == bool(self.messages_field):
            raise PacktoolError(f"{self._group_flags()} need the prompt: pass --prompt-field "
                                "(text) or --messages-field (a chat rendered with the "
                                "generation prompt), one of them")
        if self.completion_field:
            raise PacktoolError(f"--completion-field is for SFT records; with "
                                f"{self._group_flags()} the completions are those fields")
        if self.rewards_field and not self.completions_field:
            raise PacktoolError("--rewards-field goes with --completions-field (one reward "
                                "per completion)")

    def _group_flags(self) -> str:
        return ("--chosen-field/--rejected-field" if self.chosen_field
                else "--completions-field")

    @property
    def group_kind(self) -> str | None:
        """"pairs", "completions" or None (see packtool.tokenize.groups)."""
        if self.chosen_field or self.rejected_field:
            return "pairs"
        return "completions" if self.completions_field or self.rewards_field else None

    @property
    def mode(self) -> str:
        if self.group_kind:
            return self.group_kind
        if self.messages_field:
            return "messages"
        return "prompt_completion" if self.prompt_field else "text"


# ``pack``'s options in sections, each with its own check; PackOptions composes them. Which
# options cannot be combined is not checked here but in the one table, packtool.conflicts.

@dataclass(frozen=True)
class Rows:
    """What a row is: its length, what becomes of longer documents, how many segments it
    holds, --vsl's rows of 2**k, shared prompts."""

    seq_len: int = opt(None, "Tokens per pack.", "--seq-len", "-L",
                       type=("int", 1, 2**31 - 1), required=True)
    overflow: str = opt("split", "Documents longer than --seq-len: split into pieces, keep the "
                        "first seq_len tokens, or drop them (always counted).",
                        type=("choice", OVERFLOW), show_default=True)
    max_docs: int | None = opt(None, "At most K segments a pack (a fixed cu_seqlens length for "
                               "CUDA graphs: collate with max_docs=K).", type=("int", 1, None),
                               metavar="K")
    max_images: int | None = opt(None, "With images (tokenize --vision): at most N images a pack "
                                 "(the vision encoder's calls a row).", type=("int", 1, None),
                                 metavar="N")
    max_vision_tokens: int | None = opt(None, "With images: at most N image tokens a pack (its "
                                        "vision encoder's work; --seq-len counts them too).",
                                        type=("int", 1, None), metavar="N")
    vsl: str | None = opt(None, "Variable sequence length (Dataset Decomposition): cut every "
                          "document into chunks of 2**k tokens, MIN <= 2**k <= MAX (powers of "
                          "two), each a row of its own; what is left under MIN is packed with "
                          "bfd into rows of MIN. --seq-len is MAX. docs/TRAINING.md.",
                          metavar="MIN:MAX")
    share_prompt: bool = opt(False, "Pairs and groups: store each group's prompt once, then "
                             "each completion (positions continuing from the prompt's end; "
                             "attention needs packtool.torch.block_mask or model_inputs(batch, "
                             "mask='4d'), never cu_seqlens).", type="flag")
    share_prefix: bool = opt(False, "Store every beginning that sequences share once, at any "
                             "depth: within pairs and groups, and across plain records (a "
                             "repeated system prompt, a conversation's earlier turns); each "
                             "tree packed whole (packed format version 6, docs/FORMAT.md).",
                             type="flag")
    min_shared: int | None = opt(None, "--share-prefix: share a beginning only if it is at "
                                 "least N tokens (default 16: packtool.pack.trees says why).",
                                 type=("int", 1, None), metavar="N")

    def __post_init__(self):
        if self.vsl is not None and self.seq_len is None:  # --vsl sets the longest row
            with suppress(PacktoolError):  # check() says what is wrong with it
                object.__setattr__(self, "seq_len", parse_vsl(self.vsl)[1])

    @property
    def vsl_bounds(self) -> tuple[int, int] | None:  # (MIN, MAX) of --vsl, or None
        return parse_vsl(self.vsl)

    def check(self) -> None:
        if self.seq_len is None:
            if self.vsl is not None:  # a bad --vsl left seq_len unset: say what is wrong
                self.vsl_bounds  # noqa: B018
            raise PacktoolError("pack needs --seq-len (-L) N, or --vsl MIN:MAX")
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or not (
                1 <= self.seq_len < 2**31):
            raise PacktoolError(f"--seq-len must be an integer from 1 to 2,147,483,647, got "
                                f"{self.seq_len!r}")
        _choices(self)
        _ints(self, ("max_docs", "min_shared", "max_images",
                     "max_vision_tokens"))
        if self.vsl is not None and self.seq_len != self.vsl_bounds[1]:
            raise PacktoolError(f"--seq-len {self.seq_len:,} is not --vsl's MAX "
                                f"{self.vsl_bounds[1]:,} (a vsl row holds at most MAX tokens): "
                                f"drop --seq-len or pass --seq-len {self.vsl_bounds[1]}")
        if self.min_shared is not None and not self.share_prefix:
            raise PacktoolError(f"--min-shared {self.min_shared} sets what --share-prefix "
                                "shares: add --share-prefix, or drop --min-shared")


@dataclass(frozen=True)
class Alignment:
    """Segments padded to a multiple of K (Transformer Engine's THD layout): --align and the
    parallelism it derives from."""

    align: int | None = opt(None, "Pad every segment to a multiple of K tokens (Transformer "
                            "Engine's THD cu_seqlens_padded), planned in the packer so no row "
                            "exceeds --seq-len; --seq-len must be a multiple of K.",
                            type=("int", 1, 2**20), metavar="K")
    cp: int | None = opt(None, "Context-parallel size N: align segments to 2N (with --align, "
                         "--tp, --fp8: their lcm).", type=("int", 1, 2**16), metavar="N")
    tp: int | None = opt(None, "Tensor-parallel size M: with --sequence-parallel, align "
                         "segments to a multiple of M too.", type=("int", 1, 2**16),
                         metavar="M")
    sequence_parallel: bool = opt(False, "Megatron sequence parallelism (with --tp).",
                                  type="flag")
    fp8: bool = opt(False, "FP8 GEMMs: align segments to a multiple of 16 too.", type="flag")
    pad_id: int | None = opt(None, "Token id of alignment pads (default: the tokenizer's pad "
                             "token, else its eos; recorded in index.json).",
                             type=("int", 0, 2**32 - 1))

    @property
    def k(self) -> int:
        """The K every segment is padded to a multiple of: the lcm of --align, 2 x --cp,
        --tp under --sequence-parallel and 16 with --fp8 (1: no alignment)."""
        from math import lcm

        from .formats.packed.schema import parallel_alignment

        return lcm(self.align or 1, parallel_alignment(self.cp, self.tp, self.sequence_parallel,
                                                       self.fp8))

    def source(self) -> str:
        """The options that set :attr:`k`, as the user gave them (for messages)."""
        given = [f"--align {self.align}" if self.align else "",
                 f"--cp {self.cp}" if self.cp else "",
                 f"--tp {self.tp} --sequence-parallel" if self.tp and self.sequence_parallel
                 else "", "--fp8" if self.fp8 else ""]
        return ", ".join(g for g in given if g)

    def check(self, seq_len: int) -> None:
        """Positive integers, combined sensibly, and a ``seq_len`` that is a multiple of the
        alignment (a pack of aligned segments is one, so a row of exactly --seq-len tokens
        must be reachable)."""
        _ints(self, ("align", "cp", "tp", "pad_id"))
        if self.sequence_parallel and not self.tp:
            raise PacktoolError("--sequence-parallel splits sequences over the tensor-parallel "
                                "ranks: also pass --tp M")
        if self.tp and not self.sequence_parallel:
            raise PacktoolError(f"--tp {self.tp} alone does not split sequences (only Megatron's "
                                "sequence parallelism does): add --sequence-parallel, or drop "
                                "--tp")
        from .formats.packed.schema import MAX_ALIGN

        if (k := self.k) >= MAX_ALIGN:  # the lcm of --align, 2 x --cp, --tp, 16
            raise PacktoolError(f"alignment {k:,} ({self.source()}) is not below "
                                f"{MAX_ALIGN:,}, the most a packed dataset records (its readers "
                                "refuse more): use a smaller --align, --cp or --tp")
        if self.pad_id is not None and k == 1:
            raise PacktoolError("--pad-id is the id of alignment pads: give it with --align "
                                "(or --cp/--tp/--fp8), or drop it")
        if k > 1 and seq_len % k:
            lo, hi = seq_len // k * k, -(-seq_len // k) * k
            raise PacktoolError(
                f"--seq-len {seq_len:,} is not a multiple of the alignment {k} "
                f"({self.source()}): every aligned segment is a multiple of {k}, "
                f"so use --seq-len {hi:,}" + (f" or {lo:,}" if lo else ""))


@dataclass(frozen=True)
class Packer:
    """Which packer places the documents (:mod:`packtool.packers`), and its limits."""

    algo: str = opt("bfd", "Packing algorithm.", "--algo", "-a", type="algo",
                    show_default=True)
    max_depth: int | None = opt(None, "spfhp (default 12), nnlshp (default 3): documents per "
                                "pack at most.", type=("int", 1, None))
    strict: bool = False
    max_strategies: int | None = None
    work_limit: int | None = opt(None, "optimal: pricing work budget in DP cells (default 4e9, "
                                 "~15-25 s at L=4096 on 2 cores); the result is "
                                 "reproducible.", type=("int", 0, None))
    time_limit: float | None = opt(None, "optimal: also stop after this many seconds (the "
                                   "result may then differ between runs; the index records "
                                   "that).", type=("float", 0, False))

    def check(self, seq_len: int) -> None:
        from .packers import check_seq_len_memory

        check_seq_len_memory(seq_len, [self.algo])


@dataclass(frozen=True)
class Order:
    """The packs' order: the seed of every draw, the shuffle, attention balance, and packing
    in groups of documents."""

    seed: int = opt(0, "Seed for shuffling and random packers.", type=("int", 0, 2**63 - 1),
                    show_default=True)
    shuffle: bool = opt(True, "Keep the algorithm's pack order (FFD/BFD: longest first).",
                        "--no-shuffle", type="negated_flag")
    balance: str = opt("none", "attention: order the packs so that every --balance-ranks "
                       "consecutive packs are of like attention cost (sum of squared segment "
                       "lengths, plus each image's patches squared with --vision corpora), "
                       "for trainers that take one pack per rank per step in order "
                       "(the sampler's balance does this per epoch).",
                       type=("choice", BALANCE), show_default=True)
    balance_ranks: int = opt(8, "--balance attention: the ranks taking one pack each per step.",
                             type=("int", 1, None), show_default=True)
    group_docs: int | None = opt(None, "Pack consecutive groups of this many documents "
                                 "independently (bounds the packer's memory and time at 1e9 "
                                 "documents; docs/SCALE.md: its cost).", type=("int", 1, None))

    def check(self) -> None:
        _choices(self)
        _ints(self, ("seed", "group_docs"))


@dataclass(frozen=True)
class Mixture:
    """Sources mixed to target shares (the tokens in all) and documents held out."""

    tokens: int | None = opt(None, "With target shares (PREFIX=SHARE): the tokens to pack in "
                             "all, sources repeated where their share needs it (default: as "
                             "many as the scarcest source gives, none repeated).",
                             type=("int", 1, None))
    valid_docs: int | None = opt(None, "Hold out exactly this many whole non-empty documents "
                                 "(seeded, apportioned to the sources in proportion) and pack "
                                 "them into OUT/valid. Never a source's last document: every "
                                 "source keeps at least one for training.",
                                 type=("int", 1, None))
    valid_fraction: float | None = opt(None, "Hold out this fraction of each source's documents "
                                       "instead (at least one of a source of two or more, "
                                       "never its last).", type=("float", 0, True, 1, True))

    def check(self) -> None:
        _ints(self, ("tokens",))


@dataclass(frozen=True)
class Output:
    """What the dataset stores and how its sources are checked before it is committed."""

    layout: str = opt("index", "index: store the plan only, tokens read from the corpus at "
                      "load (~2% of the token bytes); tokens: self-contained shards (~1.0x).",
                      type=("choice", LAYOUTS), show_default=True)
    source_check: str = opt("crc32", "--layout tokens: how the sources are checked before "
                            "their tokens are committed: crc32 (recorded by tokenize; any "
                            "flipped byte; ~4 GB/s) or sha256 too (also an edit made to "
                            "keep the crc32; ~1.4 GB/s).", "--check",
                            type=("choice", SOURCE_CHECKS), show_default=True)
    shard_size: int = opt(1 << 27, "Tokens per shard (about).", type=("int", 1, None),
                          show_default=True)

    def check(self) -> None:
        _choices(self)
        _ints(self, ("shard_size",))


SECTIONS = {"rows": Rows, "packer": Packer, "output": Output, "order": Order,
            "mixture": Mixture, "padding": Alignment}
_SECTION_OF = {f.name: name for name, cls in SECTIONS.items() for f in fields(cls)}
# PackOptions' positional order (from when it was one flat dataclass): ``PackOptions(4096,
# "ffd", "drop")`` still means seq_len, algo, overflow
_POSITIONAL = ("seq_len", "algo", "overflow", "seed", "shuffle", "shard_size", "max_depth",
               "strict", "max_strategies", "work_limit", "time_limit", "tokens", "valid_docs",
               "valid_fraction", "group_docs", "layout", "source_check", "balance",
               "balance_ranks", "align", "cp", "tp", "sequence_parallel", "fp8", "pad_id",
               "share_prompt", "max_docs", "vsl")


@dataclass(frozen=True, init=False)
class PackOptions:
    """Everything ``pack`` is asked to do besides where to read and write: the sections
    :class:`Rows`, :class:`Packer`, :class:`Output`, :class:`Order`, :class:`Mixture` and
    :class:`Alignment` (``padding``), each with its own check. Built from the options by
    name, as the CLI gives them (``PackOptions(4096, align=16, valid_docs=100)``; positional
    in the order of ``_POSITIONAL``), or from sections (``PackOptions(rows=Rows(4096), ...)``); an
    option reads through to its section (``opts.align`` is ``opts.padding.align``)."""

    rows: Rows
    packer: Packer
    output: Output
    order: Order
    mixture: Mixture
    padding: Alignment

    def __init__(self, *args, **given):
        if len(args) > len(_POSITIONAL):
            raise TypeError(f"PackOptions() takes at most {len(_POSITIONAL)} positional "
                            f"arguments ({len(args)} given)")
        for name, value in zip(_POSITIONAL, args, strict=False):
            if name in given:
                raise TypeError(f"PackOptions() got multiple values for argument {name!r}")
            given[name] = value
        unknown = [k for k in given if k not in _SECTION_OF and k not in SECTIONS]
        if unknown:
            raise TypeError(f"PackOptions() got an unexpected keyword argument {unknown[0]!r}")
        for name, cls in SECTIONS.items():
            section = given.get(name)
            if section is None:
                section = cls(**{k: v for k, v in given.items() if _SECTION_OF.get(k) == name})
            elif not isinstance(section, cls) or any(_SECTION_OF.get(k) == name for k in given):
                raise TypeError(f"PackOptions({name}=...) takes a {cls.__name__}, and not "
                                "beside that section's options by name")
            object.__setattr__(self, name, section)

    def __getattr__(self, name):  # an option by name reads through to its section
        if name not in _SECTION_OF:
            raise AttributeError(f"PackOptions has no option {name!r}")
        return getattr(object.__getattribute__(self, _SECTION_OF[name]), name)

    @classmethod
    def option_fields(cls) -> list:
        """Every option's field, section by section (what the CLI builds its options from)."""
        return [f for section in SECTIONS.values() for f in fields(section)]

    def flat(self) -> dict:
        """Every option by name."""
        return {f.name: getattr(self, f.name) for f in self.option_fields()}

    def replace(self, **changes) -> PackOptions:
        """A copy with these options (by name) changed."""
        return PackOptions(**{**self.flat(), **changes})

    @property
    def alignment(self) -> int:
        return self.padding.k

    def packer_options(self):
        from .packers import PackerOptions

        return PackerOptions(**{f.name: getattr(self, f.name) for f in fields(PackerOptions)})

    def check(self) -> None:
        """Each section's check, then the conflicts between them (packtool.conflicts)."""
        self.rows.check()
        for section in (self.packer, self.padding):
            section.check(self.rows.seq_len)
        for section in (self.output, self.order, self.mixture):
            section.check()
        conflicts.check(self.features())

    def features(self) -> set[str]:
        """The features of :mod:`packtool.conflicts` these options turn on."""
        on = {"vsl": self.vsl is not None, "align": self.alignment > 1,
              "max_docs": self.max_docs is not None, "algo": self.algo != "bfd",
              "packer_limits": any(v is not None for v in (self.max_depth, self.work_limit,
                                                           self.time_limit)),
              "truncate": self.overflow == "truncate", "drop": self.overflow == "drop",
              "group_docs": self.group_docs is not None, "balance": self.balance != "none",
              "share_prompt": self.share_prompt, "share_prefix": self.share_prefix,
              "holdout": bool(self.valid_docs or self.valid_fraction),
              "layout_tokens": self.layout == "tokens"}
        return {name for name, used in on.items() if used}
