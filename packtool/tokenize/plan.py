"""A tokenize run as a deterministic plan of parts: consecutive input files grouped up to
``--part-bytes`` (256 MiB by default; a larger file is a part of its own, a file is never
split), each part written, checked and resumed on its own. A pure function of the inputs
(sorted, with their sizes and mtimes), the tokenizer's sha256 and the options, so every
array task computes the same plan; a part's digest covers what its bytes depend on."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from .._io import sha256_file
from ..engines.tokenizer import resolve_tokenizer_path
from ..errors import PacktoolError
from ..formats.tokens import part_manifest_path, part_name, plan_digest
from ..options import TokenizeOptions
from ..sources import RemoteInput, expand_inputs, identity

# options that change no output byte (threads, batching, engine: a fast engine is proven equal
# to the reference; part_bytes: the plan's own digest), left out of the parts' digests
NOT_IN_DIGEST = {"workers", "batch_size", "batch_bytes", "overwrite", "long_record_warn_bytes",
                 "engine", "engine_check", "part_bytes"}


# the pair/group, tree and image fields count only when given: a corpus without them keeps
# its digest
GROUP_FIELDS = ("chosen_field", "rejected_field", "completions_field", "rewards_field",
                "tree_field", "vision", "images_field", "min_pixels", "max_pixels",
                "image_check")


@dataclass(frozen=True)
class Part:
    index: int
    name: str                       # the part's file stem, beside PREFIX.json
    inputs: tuple[str, ...]
    bytes: int                      # input bytes (the estimate of its work)
    digest: str                     # of everything its bytes depend on


@dataclass(frozen=True)
class TokenizePlan:
    prefix: Path
    tokenizer: str
    parts: tuple[Part, ...]
    policy: str
    digest: str

    def part_prefix(self, part: Part) -> Path:
        return self.prefix.parent / part.name

    def part_manifest(self, part: Part) -> Path:
        return part_manifest_path(self.prefix.parent, part.name)

    @property
    def json_path(self) -> Path:
        return self.prefix.parent / f"{self.prefix.name}.json"

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


def group_files(sizes: list[int], part_bytes: int) -> list[list[int]]:
    """File indices per part: consecutive files while the part stays within ``part_bytes``
    (a file larger than that is a part of its own; files are not split; 1 = a part a file)."""
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


def plan_tokenize(inputs: list[str], tokenizer: str | Path, out: str | Path,
                  opts: TokenizeOptions) -> TokenizePlan:
    """The parts of a tokenize run. Refuses an input that is also one of the outputs."""
    opts.check()
    from ..storage.output import Output, open_output

    output = out if isinstance(out, Output) else open_output(out)
    prefix = output.check_prefix()
    paths = expand_inputs(inputs, tokenizer)
    for p in paths:
        try:
            str(p).encode("utf-8")
        except UnicodeEncodeError:
            raise PacktoolError(f"input {str(p)!r}: the name is not valid UTF-8; packtool "
                                "records input names in JSON manifests: rename the file"
                                ) from None
    ids = [identity(p) for p in paths]  # local: size, mtime...; an object: size, ETag
    tok_path = resolve_tokenizer_path(tokenizer)
    common = {"packtool": __version__, "tokenizer_sha256": sha256_file(tok_path),
              "options": {k: v for k, v in dataclasses.asdict(opts).items()
                          if k not in NOT_IN_DIGEST and not (k in GROUP_FIELDS and v is None)}}
    groups = group_files([i[0] for i in ids], opts.part_bytes)
    parts = []
    for k, g in enumerate(groups):
        name = part_name(prefix.name, k, len(groups))
        files = [[str(paths[i]), *ids[i][:2]] for i in g]
        digest = json.dumps({**common, "name": name, "files": files}, sort_keys=True)
        parts.append(Part(k, name, tuple(str(paths[i]) for i in g), sum(ids[i][0] for i in g),
                          hashlib.sha256(digest.encode()).hexdigest()))
    policy = ("one part per input file" if opts.part_bytes == 1
              else f"consecutive input files grouped up to {opts.part_bytes:,} bytes")
    plan = TokenizePlan(prefix, str(tokenizer), tuple(parts), policy,
                        plan_digest([q.digest for q in parts]))
    # an input is an output (a file there now) if it is the same file
    there = output.file_ids([plan.json_path.name] + [f"{q.name}{s}" for q in parts
                                                     for s in (".bin", ".boundaries", ".mask")])
    for p, i in zip(paths, ids, strict=True):
        if not isinstance(p, RemoteInput) and (i[3], i[2]) in there:
            raise PacktoolError(f"input {p} is also an output of --out {output.path}; choose "
                                "another --out")
    return plan
