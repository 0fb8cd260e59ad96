"""``packtool pack``: token corpora -> a packed dataset, as plan, jobs, finalize.

The plan is decided from lengths alone (pure, tested without disk); the shards are written
as jobs by whichever executor runs them (:mod:`packtool.executors`: here, on Ray, or as array
tasks), each through :func:`packtool.storage.write.run_job`; finalize writes ``index.json``
and commits the output the way its kind does (:mod:`packtool.storage.output`: a local
staging folder swapped in, or a bucket's index put last). The modules:

    plan.py       PackOptions and plan_pack: lengths -> segments, packs, order, shards
    segments.py   what documents become before packing (--overflow split/truncate/drop)
    order.py      the packs' output order (seeded shuffle, --balance attention)
    vsl.py        --vsl MIN:MAX: documents cut into power-of-two rows
    pairs.py      preference pairs and groups: a group is one item to the packer
    trees.py      --share-prefix: the token trie of records that begin alike, a tree an item
    caps.py       images: --max-images/--max-vision-tokens kept after any packer, and
                  no split through an image
    mixture.py    PREFIX:FACTOR repeats and the held-out split, from lengths alone
    selection.py  the mixture's draws as bitmaps, for --group-docs
    flow.py       sources opened and the plan turned into jobs: the whole corpus planned
                  here (WholeCorpusPlan) or group by group (StreamedPlan)
    shards.py     the shard job: its files, its entry, the task run against the output
    streamed.py   --group-docs G: a job plans and writes one group of documents
    entries.py    the job entries (.shard-K.entry.json, .group-G.entry.json) and their check
    meta.py       what index.json says besides the shards: options, counts, sources
    result.py     what pack reports
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .._progress import shown
from ..errors import PacktoolError
from ..executors import Jobs, RunOptions, finished_jobs, run_jobs
from ..formats._manifest import manifest_text
from ..formats.packed import INDEX, VALID, index
from ..formats.packed.ownership import dataset_files, ours, ours_hidden, owned
from ..storage import default_options
from ..storage.output import Output, open_output
from .flow import SourceCheck, open_sources, plan_flow, plan_sources, with_targets
from .meta import held_out_entry
from .plan import PackOptions
from .result import PackResult, run_warnings
from .shards import PackTasks, check_job, remove_entries, run_task

__all__ = ["PackResult", "dataset_files", "open_sources", "ours_hidden", "owned", "pack",
           "pack_corpus"]
MARKER = ".packtool-plan.json"
PLAN_FORMAT = "packtool.packed.plan"


def pack_corpus(prefixes: list[str | Path], out: str | Path, seq_len: int, algo: str = "bfd",
                *, overwrite: bool = False, progress: bool = False, **options) -> PackResult:
    """Pack token files into a packed dataset directory ``out``. ``options`` are the fields
    of :class:`packtool.pack.plan.PackOptions` (overflow, seed, shuffle, layout,
    shard_size...)."""
    try:
        opts = PackOptions(seq_len=seq_len, algo=algo, **options)
    except TypeError as e:
        raise PacktoolError(f"pack: {e}") from None
    return pack(prefixes, out, opts, overwrite=overwrite, progress=progress)


def pack(prefixes: list[str | Path], out: str | Path, options: PackOptions, *,
         overwrite: bool = False, progress: bool = False, verify_sources: bool = True,
         run: RunOptions | None = None) -> PackResult:
    """Plan, write the shards as jobs, finalize, to a local folder or a bucket alike.
    ``prefixes`` may carry repeat factors (``web:2.0``); held-out documents
    (``options.valid_docs``/``valid_fraction``) are packed into ``out/valid``. With
    ``layout="tokens"`` the sources' token files are verified (crc32 where recorded, else
    sha256; sha256 too with ``options.source_check="sha256"``: a full read) before the
    dataset is committed, since their bytes are copied into it (``verify_sources=False``
    skips it and says so); an index-layout dataset copies no token, and its readers verify
    each source file on its first read.

    ``run``: where the jobs run (:class:`packtool.executors.RunOptions`). The run holds
    ``out``'s lock throughout (a second run fails at once); array tasks hold it shared."""
    run = run or RunOptions()
    run.check()
    options.check()
    output = open_output(out, default_options()).as_folder()
    with output.lock(shared=run.one_task) as notes:
        result = _pack(prefixes, output, options, run, overwrite, progress, verify_sources)
    result.warnings[:0] = notes
    return result


def _pack(prefixes, out: Output, options, run, overwrite, progress, verify_sources
          ) -> PackResult:
    t0 = time.perf_counter()
    corpora, factors, digest, stored = plan_sources(prefixes, options)
    for c in corpora:
        if out.contains(c.prefix):
            raise PacktoolError(f"--out {out.path} contains the source {c.prefix}; write the "
                                "packed dataset to a directory of its own")
    # fail before the work (an array task too: it only reads OUT), and again at the end
    out.check_replaceable(overwrite, owned, INDEX, lambda names: _vouched(out, names))
    verify_sources = verify_sources and options.layout == "tokens"
    check = (SourceCheck(corpora, strong=options.source_check == "sha256")  # meanwhile
             if verify_sources and not run.one_task else None)
    target = out.staging(digest, run)
    with shown(progress):  # a packer that runs long (optimal, nnlshp) shows it is working
        flow = plan_flow(corpora, factors, options, digest, stored, str(target.path))
    notes = out.begin(target, digest, run, overwrite, MARKER,
                      {"format": PLAN_FORMAT, "digest": digest}, [INDEX, f"{VALID}/{INDEX}"])
    out.commits_to(INDEX, lambda: finished_jobs("shard"))
    try:
        run_jobs(Jobs(PackTasks(flow.items, flow.write, str(target.path),
                                out.place.storage_options or {}), run_task, flow.weights,
                      lambda j: j.label(), "pack"), run, progress)
        if run.one_task:
            return flow.result(out.path, time.perf_counter() - t0, [
                f"{run.describe()}: wrote its share of the shards; run --finalize once every "
                "task is done to write index.json"])
        splits = flow.finalize(out.path, stored, check=lambda inner: check_job(
            inner, target, checksums=run.finalize))
        if check is not None:
            check.wait()
        idx, removed = _commit(out, target, splits, overwrite)
    except BaseException as e:
        out.failed(e, target, whole_run=not run.one_task and not run.finalize)
        raise
    res = flow.result(out.path, time.perf_counter() - t0, notes, idx)
    res.sources = with_targets(res.sources, prefixes)
    res.sources_verified = verify_sources
    res.warnings += run_warnings(res, options.seq_len)
    res.published = out.published(
        "index.json last, every shard verified on upload"
        + (f"; {len(removed):,} leftover objects of an earlier run removed" if removed else ""))
    return res


def _vouched(out: Output, names: set[str]) -> None:
    """The objects at a bucket's output (``names``) are a run in progress of ours: its plan
    marker, and only objects of ours, else a refusal naming them."""
    foreign = sorted(n for n in names if not ours(out.place, n))
    try:
        marker = json.loads(out.place.read_bytes(MARKER)) if names else {}
    except (FileNotFoundError, ValueError):
        marker = {}
    if foreign or (names and (marker if isinstance(marker, dict) else {}).get("format")
                   != PLAN_FORMAT):
        raise PacktoolError(f"--out {out.path} holds objects no packtool index or plan "
                            f"marker vouches for ({', '.join((foreign or sorted(names))[:5])}); "
                            "write the dataset to a folder of its own")


def _commit(out: Output, target: Output, splits: dict, overwrite: bool
            ) -> tuple[dict, list[str]]:
    """index.json of each split (OUT/valid's first, the training index names it) written
    into the jobs' folder, the training index last with the output's own commit: a staging
    folder swapped in, or the index's put and a bucket's leftovers of ours swept. (the
    training index, the leftovers removed)"""
    held, idx, keep = None, None, set()
    for split in ("valid", "train"):
        if split not in splits:
            continue
        make_meta, shards, options = splits[split]
        sub = f"{VALID}/" if split == "valid" else ""
        idx = index(make_meta(held, out.child(VALID) if split == "valid" else out.path), shards)
        data = manifest_text(idx).encode()
        keep |= {sub + INDEX} | {sub + f["name"] for sh in shards for f in sh["files"].values()}
        if split == "valid":
            target.put(sub + INDEX, data)
            held = held_out_entry(options, idx)
    removed = out.swap_in(target, (INDEX, data), overwrite=overwrite, owned=owned, keep=keep,
                          ours=ours, remove_entries=remove_entries)
    return idx, removed
