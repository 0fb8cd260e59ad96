"""Past one machine: a deterministic plan of independent parts, and three drivers over one
part runner (datatrove's executors are the model: a slice of a fixed list per rank, a
completion record per part, a re-run skips what is finished).

    plan_tokenize(inputs, options)  -> parts (one per input file; --part-bytes groups small
                                       consecutive files up to N bytes), each with a digest
    run_part(plan, k)               -> part k's .bin/.boundaries/.mask and .NAME.part.json,
                                       renamed into place together; idempotent: a part whose
                                       files match its part manifest (same digest) is skipped
    drivers: local (parts in turn, all cores each), ray (one task per part, retried on worker
             death), tasks (--tasks N --task K: parts K, K+N, K+2N...); --finalize checks
             every part and writes PREFIX.json

``pack`` at scale keeps the assignment (lengths only, 8 bytes a document) on the driver, or
recomputed by every array task (it is deterministic), and splits the shard writing: one Ray
task per shard, or task K writes shards K, K+N...; each shard is committed with its entry
(``.shard-KKKKK.entry.json``) and ``--finalize`` writes ``index.json`` from the entries. A
part's and a shard's bytes depend only on the plan, so every driver writes the same files.

Two writers of one part (two array tasks given the same part) serialize on an ``flock`` of
``.NAME.lock``: the second waits, then finds the part finished and skips it. The lock dies
with its process, so a killed task never blocks a resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import __version__
from ._progress import progress_bar
from .errors import FormatError, PacktoolError
from .plan import RunOptions

PART_FORMAT = "packtool.tokens.part"
SHARD_FORMAT = "packtool.packed.shard"
EXECUTORS = ("local", "ray")
# options that change no output byte (threads, batching, engine: a fast engine is proven equal
# to the reference), left out of the digests so a resume may change them
_NOT_IN_DIGEST = {"workers", "batch_size", "batch_bytes", "overwrite", "long_record_warn_bytes",
                  "engine", "engine_check"}


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class Part:
    index: int
    name: str                       # the part's file stem, beside PREFIX.json
    inputs: tuple[str, ...]
    bytes: int                      # input bytes (the estimate of its work)
    digest: str                     # of everything its bytes depend on

    def prefix(self, plan: TokenizePlan) -> Path:
        return plan.prefix.parent / self.name

    def manifest(self, plan: TokenizePlan) -> Path:
        return plan.prefix.parent / f".{self.name}.part.json"


@dataclass(frozen=True)
class TokenizePlan:
    prefix: Path
    tokenizer: str
    parts: tuple[Part, ...]
    policy: str
    digest: str

    def to_json(self) -> dict:
        return {"prefix": str(self.prefix), "policy": self.policy, "n_parts": len(self.parts),
                "digest": self.digest,
                "parts": [{"index": q.index, "name": q.name, "inputs": list(q.inputs),
                           "bytes": q.bytes} for q in self.parts]}

    def manifest_entry(self) -> dict:
        return {"policy": self.policy, "n_parts": len(self.parts), "digest": self.digest,
                "prefix": self.prefix.name}

    def summary(self) -> str:
        total = sum(q.bytes for q in self.parts)
        lines = [f"{self.prefix}: {len(self.parts)} part(s), {total:,} input bytes, "
                 f"{self.policy}; plan digest {self.digest[:12]}"]
        for q in self.parts:
            shown = ", ".join(q.inputs[:3]) + (f" (+{len(q.inputs) - 3} more)"
                                                if len(q.inputs) > 3 else "")
            lines.append(f"  part {q.index}: {q.name}: {q.bytes:,} bytes: {shown}")
        return "\n".join(lines)


def group_files(sizes: list[int], part_bytes: int | None) -> list[list[int]]:
    """File indices per part: one file each, or consecutive files while the part stays within
    ``part_bytes`` (a file larger than that is a part of its own; files are not split)."""
    if part_bytes is None:
        return [[i] for i in range(len(sizes))]
    groups: list[list[int]] = []
    size = 0
    for i, n in enumerate(sizes):
        if groups and size + n <= part_bytes:
            groups[-1].append(i)
            size += n
        else:
            groups.append([i])
            size = n
    return groups


def plan_tokenize(inputs: list[str], tokenizer: str | Path, out: str | Path, opts,
                  part_bytes: int | None = None) -> TokenizePlan:
    """The parts of a tokenize run, a pure function of the inputs (sorted, with their sizes
    and mtimes), the tokenizer's sha256 and the options: every array task computes the same
    plan. A part's digest covers what its bytes depend on, so a resume reuses a part only
    when it would write the same bytes again."""
    from ._io import sha256_file
    from .sources import expand_inputs
    from .tokenizer import resolve_tokenizer_path

    if part_bytes is not None and part_bytes < 1:
        raise PacktoolError(f"--part-bytes {part_bytes}: must be at least 1")
    prefix = Path(out)
    if str(out).endswith(("/", "\\")) or prefix.is_dir():
        raise PacktoolError(f"--out {out} is a directory; give a prefix inside it, e.g. "
                            f"{prefix / 'corpus'}")
    paths = expand_inputs(inputs)
    stats = [p.stat() for p in paths]
    tok_path = resolve_tokenizer_path(tokenizer)
    common = {"packtool": __version__, "tokenizer_sha256": sha256_file(tok_path),
              "options": {k: v for k, v in dataclasses.asdict(opts).items()
                          if k not in _NOT_IN_DIGEST}}
    groups = group_files([st.st_size for st in stats], part_bytes)
    parts = []
    for k, g in enumerate(groups):
        name = prefix.name if len(groups) == 1 else f"{prefix.name}.part-{k:05d}"
        files = [[str(paths[i]), stats[i].st_size, stats[i].st_mtime_ns] for i in g]
        parts.append(Part(k, name, tuple(str(paths[i]) for i in g),
                          sum(stats[i].st_size for i in g),
                          _sha({**common, "name": name, "files": files})))
    policy = ("one part per input file" if part_bytes is None
              else f"consecutive input files grouped up to {part_bytes:,} bytes")
    plan = TokenizePlan(prefix, str(tokenizer), tuple(parts), policy,
                        _sha([q.digest for q in parts]))
    outputs = {(prefix.parent / f"{prefix.name}.json").resolve()}
    for q in parts:
        outputs |= {(prefix.parent / f"{q.name}{s}").resolve()
                    for s in (".bin", ".boundaries", ".mask")}
    for p in paths:
        if p.resolve() in outputs:
            raise PacktoolError(f"input {p} is also an output of --out {out}; choose another --out")
    return plan


# ------------------------------------------------------------------------ one part, atomic


@contextlib.contextmanager
def part_lock(path: Path):
    """Exclusive ``flock`` on ``path``, waiting for another holder; released (and the file
    removed) on exit. The inode check after locking closes the race with a holder that
    removes the file as it releases it."""
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"packtool: {path.name[1:-5]} is being written by another process; waiting "
                  "for it", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def _read_json(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def check_part(plan: TokenizePlan, part: Part) -> tuple[dict | None, str]:
    """(part manifest, "") when part ``part`` is finished: its manifest exists, is of this
    plan (same digest) and every data file has the recorded size and sha256; else (None,
    why). A half-written part never passes: its manifest is renamed in last."""
    from .formats.tokens import verify_part_files

    m = _read_json(part.manifest(plan))
    if m is None:
        return None, "missing"
    if m.get("format") != PART_FORMAT or not isinstance(m.get("part"), dict):
        return None, f"{part.manifest(plan)} is not a part manifest"
    if m.get("digest") != part.digest:
        return None, "made from other inputs or options (digest differs)"
    try:
        verify_part_files(part.prefix(plan), m["part"])
    except (FormatError, KeyError, TypeError) as e:
        return None, f"corrupt: {e}"
    return m, ""


def run_part(plan: TokenizePlan, k: int, opts, progress=False) -> tuple[dict, bool]:
    """Make part ``k`` of ``plan`` exist, verified: (its part manifest, True if it was already
    finished and so skipped). Atomic (every file under a temporary name until complete) and
    idempotent; concurrent callers for one part serialize on its lock."""
    from .formats.tokens import verify_part_files
    from .tokenize import tokenize_part

    part = plan.parts[k]
    lock = plan.prefix.parent / f".{part.name}.part.lock"  # not the run's output lock
    with part_lock(lock):
        done, _ = check_part(plan, part)
        if done is not None:
            return {**done, "skipped": True}, True
        header = {"format": PART_FORMAT, "version": 1, "index": k, "digest": part.digest,
                  "plan_digest": plan.digest}
        res = tokenize_part([Path(p) for p in part.inputs], plan.tokenizer, part.prefix(plan),
                            opts, {"manifest": part.manifest(plan), "header": header}, progress)
        manifest = res.part
        manifest["warnings"] = res.warnings
        verify_part_files(part.prefix(plan), manifest["part"])  # read back from the disk
        return manifest, False


# ------------------------------------------------------------------------------ the manifest


def _listed(items: list[str], most: int = 20) -> str:
    return "; ".join(items[:most]) + (f"; and {len(items) - most} more" if len(items) > most
                                      else "")


def _merge_engines(engines: list[dict]) -> dict:
    """One ``engine`` entry for the corpus: what ran (the same everywhere, else per part) and
    the checks summed over the parts."""
    keys = ("name", "version", "requested", "check")
    if any(tuple(e.get(k) for k in keys) != tuple(engines[0].get(k) for k in keys)
           for e in engines):
        return {"per_part": engines}
    out = {k: engines[0].get(k) for k in keys}
    if "family" in engines[0]:
        out["family"] = engines[0]["family"]
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
    fallbacks = [f"part {i}: {e['fallback']}" for i, e in enumerate(engines) if e.get("fallback")]
    if fallbacks:
        out["fallback"] = "; ".join(fallbacks)
    return out


def finalize_tokenize(plan: TokenizePlan, opts, manifests: list[dict] | None = None) -> dict:
    """Write ``PREFIX.json`` once every part of ``plan`` is finished. ``manifests`` (from
    the run just made, each read back from disk) skip the re-check; without them every
    part is checked in full (sha256 of every file) and a missing or corrupt one refused, by
    name."""
    from ._atomic import atomic_files
    from .formats.tokens import corpus_manifest

    if manifests is None:
        manifests, bad = [], []
        for q in plan.parts:
            m, why = check_part(plan, q)
            if m is None:
                bad.append(f"part {q.index} ({q.name}): {why}")
            manifests.append(m)
        if bad:
            raise PacktoolError(
                f"{len(bad)} of {len(plan.parts)} parts of {plan.prefix} are not finished: "
                + _listed(bad) + ". Run the tasks that own them again (or the same command "
                "without --finalize): finished parts are skipped, these are redone")
    metas = [m["meta"] for m in manifests]
    meta = {k: v for k, v in metas[0].items() if k != "engine"}
    for q, m in zip(plan.parts, metas, strict=True):
        other = {k: v for k, v in m.items() if k != "engine"}
        if other != meta:
            diff = sorted(k for k in set(other) | set(meta) if other.get(k) != meta.get(k))
            raise PacktoolError(f"part {q.index} ({q.name}) was made with other settings "
                                f"than part 0 ({', '.join(diff)} differ); delete its files "
                                f"({q.name}.*) and run it again")
    meta["engine"] = _merge_engines([m["engine"] for m in metas])
    manifest = corpus_manifest(meta, [m["part"] for m in manifests], plan.manifest_entry())
    json_path = plan.prefix.parent / f"{plan.prefix.name}.json"
    with atomic_files([json_path], True) as (tmp,):
        tmp.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    _remove_stale_parts(plan)
    return manifest


def _remove_stale_parts(plan: TokenizePlan) -> None:
    """Parts of an earlier plan at this prefix (their part manifests say so) that this plan
    does not list: removed once the new manifest is in place, so no orphan data stays."""
    keep = {q.name for q in plan.parts}
    folder = plan.prefix.parent
    for m in folder.glob(f".{plan.prefix.name}*.part.json"):
        name = m.name[1:-len(".part.json")]
        if name in keep or not (name == plan.prefix.name or name.startswith(
                f"{plan.prefix.name}.part-")):
            continue
        if (_read_json(m) or {}).get("format") != PART_FORMAT:
            continue
        for s in (".bin", ".boundaries", ".mask"):
            with contextlib.suppress(FileNotFoundError):
                (folder / f"{name}{s}").unlink()
        m.unlink()


# ------------------------------------------------------------------------------ the drivers


def deal(n_items: int, tasks: int, task: int) -> list[int]:
    """Task ``task``'s share of ``n_items`` (0-based, round robin: items task, task + tasks,
    ...): sorted inputs of similar sizes spread evenly, and N need not divide the count."""
    if tasks < 1 or not 0 <= task < tasks:
        raise PacktoolError(f"--task {task}: must be from 0 to --tasks - 1 = {tasks - 1} "
                            "(Slurm: --task $SLURM_ARRAY_TASK_ID with --array=0-N-1)")
    return list(range(task, n_items, tasks))


def check_run(run: RunOptions) -> None:
    executor, tasks, task, finalize = run.executor, run.tasks, run.task, run.finalize
    if executor not in EXECUTORS:
        raise PacktoolError(f"--executor {executor!r}: choose one of {', '.join(EXECUTORS)}")
    if (tasks is None) != (task is None) and not (finalize and task is None):
        raise PacktoolError("--tasks N and --task K go together (K from 0 to N-1)")
    if tasks is not None and executor != "local":
        raise PacktoolError("--tasks/--task run one share of the plan in this process; "
                            "leave out --executor ray")
    if finalize and task is not None:
        raise PacktoolError("--finalize runs once, after every task: leave out --task")


def import_ray():
    try:
        import ray
    except ImportError:
        raise PacktoolError("--executor ray needs Ray: pip install 'packtool[ray]'") from None
    return ray


@contextlib.contextmanager
def ray_session(address: str | None):
    """Join the cluster at ``address`` (``auto``, ``ray://host:10001``, ``host:6379``), or
    start a local instance; one started here is stopped on exit. An instance already
    initialized in this process (a test fixture, a notebook) is used as it is."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
        p for p in [str(Path(__file__).resolve().parent.parent),
                    os.environ.get("PYTHONPATH", "")] if p)}} if address is None else None
    try:
        ray.init(address=address, include_dashboard=False, runtime_env=env,
                 log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise PacktoolError(f"--ray-address {address}: cannot connect to Ray ({e}); start "
                            "the cluster (ray start --head) or leave out --ray-address for a "
                            "local instance") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _ray_part(plan, k, opts):
    return run_part(plan, k, opts)


def tokenize(inputs: list[str], tokenizer, out, opts, *, progress=False,
             run: RunOptions | None = None, part_bytes: int | None = None):
    """Plan, run the parts this invocation owns (``run``: where), and (unless it is one array
    task of several) write the manifest. Returns a :class:`packtool.tokenize.TokenizeResult`.

    The run holds the output's lock throughout (a second run to the same prefix fails at
    once naming the holder), except one array task of several: tasks share the output and
    serialize per part."""
    from ._atomic import output_lock

    run = run or RunOptions()
    check_run(run)
    if str(out).endswith(("/", "\\")) or Path(out).is_dir():
        raise PacktoolError(f"--out {out} is a directory; give a prefix inside it, e.g. "
                            f"{Path(out) / 'corpus'}")
    if run.one_task:
        return _tokenize(inputs, tokenizer, out, opts, progress, run, part_bytes)
    with output_lock(out) as notes:
        result = _tokenize(inputs, tokenizer, out, opts, progress, run, part_bytes)
    result.warnings[:0] = notes
    return result


def _tokenize(inputs, tokenizer, out, opts, progress, run: RunOptions, part_bytes):
    from .tokenize import TokenizeResult, check_options

    t0 = time.perf_counter()
    executor, tasks, task, finalize = run.executor, run.tasks, run.task, run.finalize
    check_options(opts)
    plan = plan_tokenize(inputs, tokenizer, out, opts, part_bytes)
    json_path = plan.prefix.parent / f"{plan.prefix.name}.json"
    if json_path.exists() and not opts.overwrite:
        raise PacktoolError(f"output already exists: {json_path}; pass --overwrite to replace "
                            "it or choose another --out")
    plan.prefix.parent.mkdir(parents=True, exist_ok=True)  # an array task may be first
    if not finalize:
        _refuse_foreign_files(plan, opts.overwrite)
    mine = (deal(len(plan.parts), tasks, task) if task is not None and not finalize
            else [] if finalize else list(range(len(plan.parts))))
    manifests: dict[int, dict] = {}
    skipped = 0
    warnings: list[str] = []
    if executor == "ray" and mine:
        manifests, skipped = _run_ray(plan, mine, opts, run.ray_address, run.ray_cpus,
                                      run.max_retries,
                                      progress)
    elif mine:
        bar = progress_bar(sum(plan.parts[k].bytes for k in mine), "tokenize", "B", progress)
        try:
            for k in mine:
                before = bar.n if bar is not None else 0
                manifests[k], was_done = run_part(plan, k, opts, bar if bar else False)
                skipped += was_done
                if bar is not None and bar.n != before + plan.parts[k].bytes:
                    bar.update(before + plan.parts[k].bytes - bar.n)  # a skipped part
        finally:
            if bar is not None:
                bar.close()
    for m in manifests.values():
        warnings += [w for w in m.get("warnings", []) if w not in warnings]
    one_task = run.one_task
    if one_task:
        entries = [manifests[k]["part"] for k in mine]
        n_parts = len(mine)
    else:
        ms = None if finalize else [manifests[k] for k in range(len(plan.parts))]
        manifest = finalize_tokenize(plan, opts, ms)
        entries = manifest["parts"]
        n_parts = len(plan.parts)
    inputs_meta = [i for e in entries for i in e["inputs"]]
    return TokenizeResult(
        prefix=str(plan.prefix), n_docs=sum(e["n_docs"] for e in entries),
        n_tokens=sum(e["n_tokens"] for e in entries),
        n_empty=sum(e["n_empty"] for e in entries),
        n_skipped=sum(sum(i.get("skipped", {}).values()) for i in inputs_meta),
        dtype=(next(iter(manifests.values()))["meta"]["dtype"] if manifests
               else manifest["dtype"]),
        seconds=time.perf_counter() - t0, inputs=inputs_meta, warnings=warnings,
        n_parts=n_parts, n_parts_skipped=skipped,
        n_tokens_tokenized=sum(m["part"]["n_tokens"] for m in manifests.values()
                               if not m.get("skipped")),
        executor=("finalize" if finalize else f"task {task} of {tasks}" if one_task
                  else executor))


def _refuse_foreign_files(plan: TokenizePlan, overwrite: bool) -> None:
    """Data files at a part's name without a part manifest are not a part of ours (a version-1
    corpus, another tool's file): replaced only under --overwrite."""
    if overwrite:
        return
    for q in plan.parts:
        if q.manifest(plan).exists():
            continue
        found = [f"{q.prefix(plan)}{s}" for s in (".bin", ".boundaries", ".mask")
                 if Path(f"{q.prefix(plan)}{s}").exists()]
        if found:
            raise PacktoolError(f"output already exists: {', '.join(found)} (not a finished "
                                "part of a packtool run); pass --overwrite to replace it or "
                                "choose another --out")


def _run_ray(plan, mine, opts, address, cpus, max_retries, progress):
    """One Ray task per part (``cpus`` tokenizer threads each), retried on worker death; one
    progress bar over the parts' input bytes."""
    if cpus < 1:
        raise PacktoolError(f"--ray-cpus {cpus}: must be at least 1")
    opts = dataclasses.replace(opts, workers=opts.workers or cpus)
    manifests, skipped = {}, 0
    with ray_session(address) as ray:
        remote = ray.remote(num_cpus=cpus, max_retries=max_retries)(_ray_part)
        plan_ref = ray.put(plan)
        refs = {remote.remote(plan_ref, k, opts): k for k in mine}
        bar = progress_bar(sum(plan.parts[k].bytes for k in mine), "tokenize (ray)", "B",
                           progress)
        try:
            while refs:
                done, _ = ray.wait(list(refs), num_returns=1)
                for ref in done:
                    k = refs.pop(ref)
                    try:
                        manifests[k], was_done = ray.get(ref)
                    except Exception as e:
                        raise _ray_error(e, f"part {k} ({plan.parts[k].name})") from None
                    skipped += was_done
                    if bar is not None:
                        bar.update(plan.parts[k].bytes)
        except BaseException:
            for ref in refs:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            raise
        finally:
            if bar is not None:
                bar.close()
    return manifests, skipped


def _ray_error(e: Exception, what: str) -> Exception:
    """A PacktoolError raised inside a task comes back as itself (same message); anything
    else names the part and the Ray error."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, PacktoolError):
        return cause
    return PacktoolError(f"{what} failed on Ray: {type(e).__name__}: {e}")


# ----------------------------------------------------------------------------- pack at scale


@dataclass(frozen=True)
class ShardJob:
    """Shard ``k`` of a split ("train" in OUT, "valid" in OUT/valid) and its segments."""

    split: str
    k: int
    seg_len: np.ndarray
    pack_nseg: np.ndarray
    seg_doc: np.ndarray
    seg_offset: np.ndarray
    digest: str


def shard_jobs(layouts: dict, common: dict) -> list[ShardJob]:
    """Every shard of every split, in order (valid first: its index is written first)."""
    jobs = []
    for split, layout in layouts.items():
        for k in range(layout.n_shards):
            packs, segs = layout.shard(k)
            a = (layout.seg_length[segs], layout.pack_nseg[packs], layout.seg_doc[segs],
                 layout.seg_offset[segs])
            h = hashlib.sha256(json.dumps({**common, "split": split, "k": k},
                                          sort_keys=True).encode())
            for arr in a:
                h.update(np.ascontiguousarray(arr, np.int64).tobytes())
            jobs.append(ShardJob(split, k, *a, h.hexdigest()))
    return jobs


def _split_dir(out: Path, split: str) -> Path:
    from .pack import VALID

    return out / VALID if split == "valid" else out


def _entry_path(out: Path, job: ShardJob) -> Path:
    return _split_dir(out, job.split) / f".shard-{job.k:05d}.entry.json"


def check_shard(out: Path, job: ShardJob, checksums: bool = True) -> tuple[dict | None, str]:
    """(the shard's index entry, "") when shard ``job`` is written and intact (its entry of
    the same digest, every file's size and crc32), else (None, why)."""
    from .formats.packed import check_crc

    m = _read_json(_entry_path(out, job))
    if m is None:
        return None, "missing"
    if m.get("format") != SHARD_FORMAT or m.get("digest") != job.digest:
        return None, "made from another plan (digest differs)"
    try:
        directory = _split_dir(out, job.split)
        for f in m["entry"]["files"].values():
            path = directory / f["name"]
            if not path.is_file() or path.stat().st_size != f["bytes"]:
                return None, f"{path} is missing or of the wrong size"
            if checksums:
                check_crc(path, f["crc32"])
    except FormatError as e:
        return None, f"corrupt: {e}"
    except (KeyError, TypeError) as e:
        return None, f"unreadable entry ({e})"
    return m["entry"], ""


def write_shard_job(out: Path, job: ShardJob, prefixes: list[str], seq_len: int
                    ) -> tuple[dict, bool]:
    """Write one shard into ``out`` (or ``out/valid``) and its entry, atomically (a temporary
    folder, then each file renamed in, the entry last); skipped when already intact."""
    from .formats.packed import PackedWriter
    from .pack import _write_shard_arrays, open_sources

    directory = _split_dir(out, job.split)
    directory.mkdir(exist_ok=True)
    with part_lock(directory / f".shard-{job.k:05d}.lock"):
        done, _ = check_shard(out, job)
        if done is not None:
            return done, True
        corpora = open_sources(prefixes)
        tok_dtype = max((c.dtype for c in corpora), key=lambda d: d.itemsize)
        tmp = directory / f".shard-{job.k:05d}.tmp-{os.getpid()}-{secrets.token_hex(3)}"
        tmp.mkdir()
        try:
            writer = PackedWriter(tmp, seq_len, tok_dtype, any(c.has_mask for c in corpora))
            entry = _write_shard_arrays(writer, job.seg_len, job.pack_nseg, job.seg_doc,
                                        job.seg_offset, corpora, None, k=job.k)
            (tmp / "entry.json").write_text(json.dumps(
                {"format": SHARD_FORMAT, "version": 1, "digest": job.digest, "entry": entry}))
            for f in entry["files"].values():
                os.replace(tmp / f["name"], directory / f["name"])
            os.replace(tmp / "entry.json", _entry_path(out, job))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return entry, False


def _ray_shard(out, job, prefixes, seq_len):
    return write_shard_job(Path(out), job, prefixes, seq_len)


@dataclass
class PackInputs:
    """What ``pack`` planned, for :func:`pack_parts`: the layouts (training and held-out)
    and the sources (opened corpora, their prefixes and repeat factors)."""

    layout: object               # packtool.plan.PackLayout
    valid: object | None
    corpora: list
    prefixes: list[str]
    factors: list[float]


def pack_parts(inputs: PackInputs, out: Path, *, overwrite: bool, progress,
               run: RunOptions) -> dict | None:
    """Write ``layout``'s shards (and ``valid``'s, into OUT/valid) as independent jobs, then
    index.json from their entries; returns the index, or None for one array task's share.
    Until index.json is renamed in, OUT is not a dataset any reader opens."""
    from ._io import sha256_file
    from .formats.packed import INDEX
    from .formats.tokens import prefix_paths
    from .pack import VALID

    layout, valid, corpora = inputs.layout, inputs.valid, inputs.corpora
    prefixes, factors = inputs.prefixes, inputs.factors
    executor, tasks, task, finalize = run.executor, run.tasks, run.task, run.finalize
    out = Path(os.path.abspath(out))
    if out.exists() and not out.is_dir():
        raise PacktoolError(f"output {out} exists and is not a directory; choose another --out")
    if (out / INDEX).exists():
        if not overwrite:
            raise PacktoolError(f"output already exists: {out / INDEX}; pass --overwrite to "
                                "replace it or choose another --out")
        if not finalize:  # the shards are about to change: no stale index may vouch for them
            for p in (out / VALID / INDEX, out / INDEX):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
    elif out.exists() and not finalize and any(
            not n.startswith(".") and not n.startswith("shard-") and n != VALID
            for n in os.listdir(out)):
        raise PacktoolError(f"--out {out} holds other files; write the packed dataset to a "
                            "directory of its own")
    out.mkdir(parents=True, exist_ok=True)
    opts = layout.options
    common = {"packtool": __version__, "options": dataclasses.asdict(opts),
              "sources": [sha256_file(prefix_paths(c.prefix)["json"]) for c in corpora],
              "factors": factors}
    layouts = {"valid": valid, "train": layout} if valid is not None else {"train": layout}
    jobs = shard_jobs(layouts, common)
    if finalize:
        return _finalize_pack(out, jobs, layouts, corpora, factors)
    mine = deal(len(jobs), tasks, task) if task is not None else list(range(len(jobs)))
    total = sum(int(jobs[j].seg_len.sum()) for j in mine)
    bar = progress_bar(total, "pack" if executor == "local" else "pack (ray)", "tok", progress)
    try:
        if executor == "ray":
            with ray_session(run.ray_address) as ray:
                remote = ray.remote(num_cpus=2, max_retries=run.max_retries)(_ray_shard)
                refs = {remote.remote(str(out), jobs[j], prefixes, opts.seq_len): j
                        for j in mine}
                while refs:
                    done, _ = ray.wait(list(refs), num_returns=1)
                    for ref in done:
                        j = refs.pop(ref)
                        try:
                            ray.get(ref)
                        except Exception as e:
                            raise _ray_error(e, f"shard {jobs[j].k} ({jobs[j].split})") from None
                        if bar is not None:
                            bar.update(int(jobs[j].seg_len.sum()))
        else:
            for j in mine:
                write_shard_job(out, jobs[j], prefixes, opts.seq_len)
                if bar is not None:
                    bar.update(int(jobs[j].seg_len.sum()))
    finally:
        if bar is not None:
            bar.close()
    if task is not None and tasks > 1:
        return None
    return _finalize_pack(out, jobs, layouts, corpora, factors, checksums=False)


def _finalize_pack(out: Path, jobs, layouts, corpora, factors, checksums: bool = True) -> dict:
    """Check every shard of the plan (size and crc32 of every file, unless just written and
    read back here) and the sources, then write index.json (OUT/valid's first)."""
    from .formats.packed import INDEX
    from .pack import held_out_entry, index_meta, layout_writer

    entries, bad = {}, []
    for job in jobs:
        entry, why = check_shard(out, job, checksums)
        if entry is None:
            bad.append(f"{job.split} shard {job.k} (shard-{job.k:05d}): {why}")
        entries[(job.split, job.k)] = entry
    if bad:
        raise PacktoolError(
            f"{len(bad)} of {len(jobs)} shards of {out} are not written: " + _listed(bad)
            + ". Run the tasks that own them again (finished shards are skipped)")
    if checksums:  # a task of several does not verify the sources: done once, here
        for c in corpora:
            c.verify_checksums()
    held_out, index = None, None
    for split, layout in layouts.items():
        directory = _split_dir(out, split)
        with contextlib.ExitStack() as stack:
            tmp = Path(stack.enter_context(_temp_dir(directory)))
            writer = layout_writer(layout, corpora, tmp)
            writer.shards = [entries[(split, k)] for k in range(layout.n_shards)]
            index = writer.finish(index_meta(layout, corpora, factors, split, held_out))
            os.replace(tmp / INDEX, directory / INDEX)
        if split == "valid":
            held_out = held_out_entry(layout.options, index)
    return index  # the entries stay: a re-run of the same plan skips every intact shard


@contextlib.contextmanager
def _temp_dir(directory: Path):
    tmp = directory / f".index.tmp-{os.getpid()}-{secrets.token_hex(3)}"
    tmp.mkdir()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
