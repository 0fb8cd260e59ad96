"""``packtool export``: a token corpus or a packed dataset in another trainer's native format.

One dispatcher over one module per format beside it (packtool/export/): each holds a writer
for the sources it can represent, and the layout written down beside it. There is no packtool
reader or validator of these formats: the trainers' own libraries read them, and the tests
read every export back with them (megatron-core, mosaicml-streaming, pyarrow and Hugging Face
datasets; llm.c's header by a reader written from its layout). SRC is a token-file prefix
(documents) or a packed directory (packs); what each format keeps and loses is in
docs/EXPORT.md::

    format          corpus (documents)             packed dataset (packs)
    megatron        .bin/.idx, 1 sequence per doc  1 sequence per segment, 1 document per pack
    llmc            EOS-delimited uint16 shards    (refused: a flat stream has no packs)
    mds             (refused: pack first)          1 sample per pack
    parquet         (refused: pack first)          1 row per pack, Hugging Face columns
    parquet-packed  (refused: pack first)          1 row per pack, Megatron-Bridge columns

Every writer streams shard by shard (or in fixed chunks of documents) into the folder it is
given, so memory stays bounded by one shard's segment table; the output publishes what it
wrote (:mod:`packtool.storage.output`: renamed into place, or uploaded), the marker last,
so an interrupted export leaves nothing under the requested name.

Modules: one per format (:mod:`.megatron`, :mod:`.llmc`, :mod:`.mds`, :mod:`.parquet`
for both parquet layouts), and :mod:`.marker` the small manifest that marks an export as
packtool's.
"""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import conflicts
from .._progress import progress_bar
from ..errors import PacktoolError
from ..storage import default_options, kind_of
from ..storage.output import Output, open_output
from .marker import MARKER, write_marker  # noqa: F401 - the marker's public names

# (format, source kind) -> "module:function" in packtool.formats; imported on use so that
# `packtool --help` and the formats a user does not ask for import nothing heavy
WRITERS = {
    ("megatron", "corpus"): "megatron:export_corpus",
    ("megatron", "packed"): "megatron:export_packed",
    ("llmc", "corpus"): "llmc:export_corpus",
    ("mds", "packed"): "mds:export_packed",
    ("parquet", "packed"): "parquet:export_hf",
    ("parquet-packed", "packed"): "parquet:export_bridge",
}
FORMATS = tuple(dict.fromkeys(f for f, _ in WRITERS))
# writer options -> (CLI flag, the writers that use it): an option given where it does
# nothing is refused rather than silently ignored
OPTIONS = {
    "shard_tokens": ("--shard-tokens", {("llmc", "corpus")}),
    "eos_id": ("--eos-id", {("llmc", "corpus")}),
    "link": ("--copy", {("megatron", "corpus")}),  # link=False is --copy
}
RECORDS = {"corpus": "documents", "packed": "packs"}
# pairs and groups (tokens version 4, packed 5): a format whose rows can name each
# sequence's group and role carries them (mds, parquet: seq_group, seq_role beside the
# segments); the others would hand a trainer chosen and rejected alike as text to learn,
# so they are refused, by name, with the reason
NO_GROUPS = {
    "megatron": "Megatron's GPTDataset has no notion of a group or a role: every sequence, "
                "the rejected ones included, would be trained on as plain text (and with "
                "--share-prompt, as one causal row, each completion would attend to its "
                "siblings)",
    "llmc": "an llm.c token stream has no groups or roles: chosen and rejected completions "
            "would be trained on alike as text",
    "parquet-packed": "Megatron-Bridge's GPTSFTPackedParquetDataset has no group or role "
                      "column: it would train on every completion, the rejected ones "
                      "included, as SFT",
}
GROUPS_FIX = ("train from the packed dataset with packtool.torch (block_mask, sequence_logps: "
              "docs/TRAINING.md), or export --format parquet or mds from a pack without "
              "--share-prompt (their seq_group and seq_role columns name each sequence)")

# images (tokenize --vision): parquet carries each row's image references, grids and mRoPE
# ids (columns image_refs, image_grid_thw, mrope_position_ids); the others have no place for
# them, so a trainer would get image tokens with no pixels: refused, by name
NO_IMAGES = {
    "megatron": "Megatron's GPTDataset holds token ids alone: the image tokens would reach the "
                "model with no pixels, and its 1-D positions are not Qwen-VL's 3-D ones",
    "llmc": "an llm.c token stream holds token ids alone: no pixels, no 3-D positions",
    "mds": "packtool's MDS samples have no image columns (not supported yet)",
    "parquet-packed": "Megatron-Bridge's GPTSFTPackedParquetDataset has no image columns",
}
IMAGES_FIX = ("export --format parquet from the packed dataset (image_refs, image_grid_thw, "
              "mrope_position_ids columns), or train from it with packtool.torch and "
              "packtool.train.vision.ImageCollator")


@dataclass
class ExportResult:
    src: str
    kind: str                 # "corpus" or "packed"
    format: str
    out: str
    files: list[str]
    n_records: int            # documents or packs read from SRC
    n_tokens: int             # tokens of SRC exported
    bytes_written: int        # bytes this run wrote (a hard-linked .bin counts 0)
    seconds: float
    notes: list[str] = field(default_factory=list)  # what the format could not carry, link/copy
    details: dict = field(default_factory=dict)

    @property
    def mb_per_second(self) -> float:
        return self.bytes_written / 1e6 / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        text = (
            f"{self.out}: {self.format} from {self.kind} {self.src}: {self.n_records:,} "
            f"{RECORDS[self.kind]}, {self.n_tokens:,} tokens, {len(self.files)} file(s), "
            f"{self.bytes_written / 1e6:,.1f} MB written in {self.seconds:.1f}s "
            f"({self.mb_per_second:,.0f} MB/s)"
        )
        return text + "".join(f"\n  note: {n}" for n in self.notes)

    def to_json(self) -> dict:
        d = asdict(self)
        d["mb_per_second"] = self.mb_per_second
        return d


def _open(src: str | Path, kind: str):
    if kind == "packed":
        from ..formats.packed import open_packed

        return open_packed(src)
    from ..formats.tokens import open_tokens

    return open_tokens(src)


def _source_paths(source, kind: str) -> list[Path]:
    from ..storage import local_file

    if local_file(source.directory if kind == "packed" else source.prefix) is None:
        return []  # a remote source is never a local output
    if kind == "packed":
        return [Path(os.path.abspath(source.directory))]
    from ..formats.tokens import prefix_paths

    files = [*source.data_files(), prefix_paths(source.prefix)["json"]]
    return [Path(os.path.abspath(p)) for p in files]


def _refuse_self_overwrite(source, kind: str, output: Output) -> None:
    """The output never replaces the data being read (even with --overwrite), nor lands
    inside a packed dataset being read."""
    target, out = output.local_target, Path(output.given)
    for p in _source_paths(source, kind) if target is not None else []:
        same_prefix = kind == "corpus" and p.with_suffix("") == target.with_suffix("")
        if target == p or target in p.parents or same_prefix:
            raise PacktoolError(
                f"--out {out} would replace the source {p}; choose another --out"
            )
        # inside it (or inside the dataset whose held-out split it is), the index would not
        # list the export: `verify` then fails on it
        whole = p.parent if kind == "packed" and (p.parent / "index.json").is_file() else p
        if kind == "packed" and whole in target.parents:
            raise PacktoolError(f"--out {out} is inside the packed dataset {whole} it exports "
                                "from; choose an --out outside it")


def export(src: str | Path, fmt: str, out: str | Path, *, overwrite: bool = False,
           progress: bool = False, **options) -> ExportResult:
    """Export SRC (token prefix or packed directory) as ``fmt`` to ``out``.

    ``options`` go to the format's writer: ``shard_tokens``/``eos_id`` (llmc),
    ``link`` (megatron from a corpus: hard-link the .bin, default True).
    """
    if fmt not in FORMATS:
        raise PacktoolError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    kind = kind_of(src)  # "packed": a directory holding index.json; "corpus": a prefix
    writer = WRITERS.get((fmt, kind))
    if writer is None:
        takes = [k for f, k in WRITERS if f == fmt]
        fix = ("pack it first (packtool pack SRC --seq-len N --out DIR) and export DIR"
               if kind == "corpus" else
               "export the token corpus it was packed from (its `packtool pack` input)")
        raise PacktoolError(
            f"{src} is a {'token corpus' if kind == 'corpus' else 'packed dataset'}, but "
            f"--format {fmt} holds {' or '.join(RECORDS[k] for k in takes)} only; {fix}"
        )
    for name, value in options.items():
        if name not in OPTIONS:
            raise PacktoolError(f"unknown export option {name!r}; known: {', '.join(OPTIONS)}")
        flag, used_by = OPTIONS[name]
        given = value is not None and not (name == "link" and value)
        if given and (fmt, kind) not in used_by:
            where = " or ".join(f"--format {f} from a {'token corpus' if k == 'corpus' else k}"
                                for f, k in sorted(used_by))
            raise PacktoolError(f"{flag} applies to {where} only; drop it for --format {fmt}")
    source = _open(src, kind)
    refuse_groups(source, kind, fmt, src)
    refuse_images(source, kind, fmt, src)
    output = open_output(out, default_options())
    _refuse_self_overwrite(source, kind, output)
    if kind == "corpus":  # before anything is written (a hard link reads nothing)
        source.verify_checksums()
    module, fn = writer.split(":")
    write = getattr(importlib.import_module(f".{module}", __name__), fn)
    n_tokens = source.n_tokens if kind == "corpus" else int(source.index["n_tokens"])
    bar = progress_bar(n_tokens, f"export {fmt}", enabled=progress)
    t0 = time.perf_counter()
    try:
        info = _write(write, fmt, source, output, overwrite,
                      bar.update if bar is not None else _no_tick, options)
    finally:
        if bar is not None:
            bar.close()
    return ExportResult(
        src=str(src), kind=kind, format=fmt, out=str(out), files=[str(f) for f in info["files"]],
        n_records=len(source), n_tokens=n_tokens, bytes_written=int(info["bytes_written"]),
        seconds=time.perf_counter() - t0, notes=list(info.get("notes", [])),
        details=dict(info.get("details", {})),
    )


def refuse_groups(source, kind: str, fmt: str, src) -> None:
    """Pairs or groups refused where ``fmt`` cannot carry them (:data:`NO_GROUPS`), and prefix
    trees (--share-prompt, --share-prefix) everywhere but parquet, which carries ``seq_up``
    (:mod:`packtool.conflicts`)."""
    groups = source.groups if kind == "corpus" else source.index.get("groups")
    trees = None if kind == "corpus" else source.index.get("trees")
    if trees and trees.get("min_shared") and fmt != "parquet":
        conflicts.check({"share_prefix", "export_segments"},
                        f"{src} holds prefix trees; --format {fmt} cannot carry them")
    if not groups:
        return
    reason = NO_GROUPS.get(fmt)
    what = "preference pairs" if groups["kind"] == "pairs" else "groups of completions"
    shared = " packed with --share-prompt" if groups.get("share_prompt") else ""
    if reason is None and shared and fmt != "parquet":
        conflicts.check({"share_prompt", "export_segments"},
                        f"{src} holds {what}{shared}; --format {fmt} cannot carry them")
    if reason is not None:
        raise PacktoolError(f"{src} holds {what}{shared}; --format {fmt} cannot carry them: "
                            f"{reason}; {GROUPS_FIX}")


def refuse_images(source, kind: str, fmt: str, src) -> None:
    """Images refused where ``fmt`` cannot carry them (:data:`NO_IMAGES`); a token corpus's
    everywhere (its documents' images go with packs: pack it, export --format parquet)."""
    if not (source.vision if kind == "corpus" else source.images[0]):
        return
    reason = NO_IMAGES.get(fmt)
    if kind == "corpus":
        reason = reason or "this format takes packs"
    if reason is not None:
        raise PacktoolError(f"{src} holds images (tokenize --vision); --format {fmt} cannot "
                            f"carry them: {reason}; {IMAGES_FIX}")


def _write(write, fmt: str, source, out: Output, overwrite: bool, tick, options: dict
           ) -> dict:
    """Run a format's writer into the folder the output gives (under the output's lock,
    what is at the output proven ours first), then publish what it wrote: a single-file
    export with its sidecar, the marker or sidecar last; the output decides how (renamed
    into place, or uploaded, the previous export's objects it does not list removed)."""
    from .marker import sidecar_path, write_sidecar

    side = sidecar_path(Path(out.name)).name
    with out.export_session(lambda o, old: _owned_there(o, old, overwrite, side)
                            ) as (folder, old):
        info = write(source, folder / out.name, tick=tick, **options)
        if not (folder / out.name).is_dir():
            write_sidecar(folder, side, fmt, source)
        return out.publish_export(folder, info, old, MARKER, side)


def _owned_there(out: Output, old: set, overwrite: bool, side: str) -> None:
    """What is at the export's names is ours to replace (a directory export's marker, a
    single-file export's sidecar, proves it), or a refusal naming it: a folder and a bucket
    alike."""
    from .marker import export_owned, files_owned

    if old and not overwrite:
        raise PacktoolError(f"output already exists: {out.path}; pass --overwrite to "
                            "replace it")
    if old:
        export_owned(out.as_folder().place)
    single = [f"{out.name}.bin", f"{out.name}.idx", f"{out.name}.parquet"]
    found = [n for n in single if out.place.exists(n)]
    if out.place.is_file(out.name) or out.place.is_link(out.name):
        found.insert(0, out.name)
    if not found:
        return
    if not overwrite:
        raise PacktoolError(f"output already exists: "
                            f"{', '.join(str(out.place.path(n)) for n in found)}; pass "
                            "--overwrite to replace it")
    files_owned(side, found, out.place)


def _no_tick(n: int) -> None:
    """The progress callback when no bar is shown: counts nothing."""
