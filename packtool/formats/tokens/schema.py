"""The token format's schema: its files, the corpus manifest ``PREFIX.json``, the part
entries it lists, and each part's own manifest ``.NAME.part.json``; every key documented (a
test checks docs/FORMAT.md against ``MANIFEST_KEYS`` and ``PART_KEYS``) and every manifest
checked against these specs on read, in one place.

Version 3 binds a corpus together so that no edit passes unnoticed: ``manifest_sha256`` is the
digest of the manifest itself; every part entry carries its position (``index``) and its
``digest`` (of the inputs, tokenizer and options it was made from), the plan's ``digest`` is
the digest of those, and a part's files are named after its position. A part reordered,
duplicated, dropped or taken from another corpus breaks one of these, and its own
``.NAME.part.json`` (written by the run that made it) is required, must agree with its entry,
and must be the one whose sha256 the corpus manifest records (``part_manifests_sha256``):
editing a corpus then takes recomputing every digest of every file, a forgery that no check
without a secret or the original inputs can refuse.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import __version__
from .._manifest import (
    Key,
    anything,
    boolean,
    count,
    dict_of,
    hexstr,
    list_of,
    nullable,
    obj,
    one_of,
    string,
)

FORMAT = "packtool.tokens"
VERSION = 3
GROUPED_VERSION = 4  # version 3 plus pairs/groups (.roles, .prompt, .rewards, "groups")
IMAGES_VERSION = 5  # version 3 plus images (.images, .img_grid, .img_span, .img_ref.jsonl,
#                     .pos3, "images")
READABLE = (1, 2, 3, 4, 5)  # 1: one PREFIX.bin, checksums at the top level; 2: parts, no digests
PART_FORMAT = "packtool.tokens.part"
PART_VERSION = 2
UINT16_MAX_VOCAB = 65_536
DIGEST_KEY = "manifest_sha256"
PARTS_KEY = "part_manifests_sha256"
FIX = "re-run packtool tokenize"


@dataclass(frozen=True)
class File:
    suffix: str
    dtype: str      # "tokens" (from the manifest's dtype) or a numpy dtype string
    per: str        # "token", "document" or "image"
    doc: str
    optional: str | None = None  # present only when the manifest has this key true
    width: int = 1  # items per token, document or image


SCHEMA = (
    File(".bin", "tokens", "token", "token ids back to back, in input order; no header"),
    File(".boundaries", "<i8", "document", "cumulative end offset of each document"),
    File(".mask", "|u1", "token", "1 = the loss is taken on this token", optional="mask"),
    File(".roles", "<u2", "document", "version 4: the sequence's role: 1 chosen, 2 rejected, "
         "3 + k completion k of its group; a group starts at a 1 or a 3", optional="groups"),
    File(".prompt", "<u4", "document", "version 4: tokens of the group's prompt at the start "
         "of the sequence (the same tokens in every sequence of a group)", optional="groups"),
    File(".rewards", "<f4", "document", "version 4 with --rewards-field: the sequence's "
         "reward", optional="rewards"),
    File(".tree", "<u8", "document", "with --tree-field: the document's tree id (the first 8 "
         "bytes, little-endian, of the blake2b of the field's canonical JSON)",
         optional="tree_field"),
    File(".images", "<i8", "document", "version 5: cumulative end of each document's images "
         "in the part's images", optional="images"),
    File(".img_grid", "<u4", "image", "version 5: 3 per image, its (t, h, w) in patches",
         optional="images", width=3),
    File(".img_span", "<i8", "image", "version 5: 2 per image, the offset in its document of "
         "its first image token and the count of its image tokens", optional="images",
         width=2),
    File(".img_ref.jsonl", "json", "image", "version 5: one JSON object per image: where its "
         "bytes are and their sha256, never the pixels", optional="images"),
    File(".pos3", "<i4", "token", "version 5 with an mRoPE rule: 3 per token, row-major "
         "[n_tokens, 3]: (temporal, height, width) positions, from 0 in every document",
         optional="images", width=3),
)
IMAGE_KEYS = ("images", "img_grid", "img_span", "img_ref.jsonl", "pos3")
DATA_SUFFIXES = tuple(f.suffix for f in SCHEMA)
SUFFIXES = (*DATA_SUFFIXES, ".json")
DATA_KEYS = tuple(f.suffix[1:] for f in SCHEMA)  # "bin", "boundaries", "mask"
FILES = dict(zip(DATA_KEYS, SCHEMA, strict=True))

_SHA = obj({"sha256": hexstr(64), "bytes": count(), "crc32": Key(hexstr(8), "", optional=True)})
_CHECKSUMS = obj({"bin": _SHA, "boundaries": _SHA, "mask": Key(_SHA, "", optional=True),
                  **{k: Key(_SHA, "", optional=True) for k in ("roles", "prompt", "rewards",
                                                                "tree", *IMAGE_KEYS)}},
                 extra=False)
_CONTENT_KEYS = obj({"bytes": count(), "crc32": Key(hexstr(8), "", optional=True),
                    "fingerprint": Key(string(True), "", optional=True)})


def _content(v):
    """A local input's crc32, or an object's fingerprint (its store's ETag or version)."""
    problem = _CONTENT_KEYS(v)
    if problem is None and ("crc32" in v) == ("fingerprint" in v):
        return "an object with crc32 (a local input) or fingerprint (an object's ETag/version)"
    return problem


_INPUT = obj({"path": string(), "kind": nullable(string()), "n_docs": count(),
              "blank_lines": Key(count(), "", optional=True),
              "skipped": Key(dict_of(count()), "", optional=True),
              "skipped_records": Key(list_of(count()), "", optional=True),
              "content": Key(_content, "", optional=True)})

PART_KEYS = {  # every key of a part entry (manifest "parts", and the part's .NAME.part.json)
    "name": Key(string(True), "the part's file name stem: NAME.bin, NAME.boundaries, NAME.mask"),
    "index": Key(count(), "version 3: the part's position in the corpus (0, 1, ...)"),
    "digest": Key(hexstr(64), "version 3: sha256 of what the part's bytes depend on"),
    "n_docs": Key(count(), "documents in the part"),
    "n_tokens": Key(count(), "tokens in the part"),
    "n_empty": Key(count(), "zero-length documents"),
    "n_trained_tokens": Key(count(), "tokens with mask 1"),
    "n_groups": Key(count(), "version 4: pairs or groups in the part (each input's n_docs "
                    "counts its records, so groups)", optional=True),
    "n_images": Key(count(), "version 5: images in the part", optional=True),
    "n_vision_tokens": Key(count(), "version 5: image tokens in the part", optional=True),
    "inputs": Key(list_of(_INPUT), "per input file of the part: path, kind, n_docs, content, "
                  "skipped..."),
    "checksums": Key(_CHECKSUMS, "per data file of the part: sha256, bytes and crc32 (corpora "
                     "made before packtool 0.1.0's crc32 lack it)"),
}
_PART_V2 = obj({**{k: v for k, v in PART_KEYS.items() if k not in ("index", "digest")},
                "n_empty": Key(count(), "", optional=True),
                "n_trained_tokens": Key(count(), "", optional=True),
                "inputs": Key(list_of(_INPUT), "", optional=True)})

_GROUPS = obj({"kind": one_of("pairs", "completions"), "n_groups": count(),
               "rewards": boolean()})

_IMAGES = obj({"rule": string(True), "min_pixels": nullable(count()),
               "max_pixels": nullable(count()), "patch": count(1), "merge": count(1),
               "image_token_id": count(), "vision_start_id": nullable(count()),
               "vision_end_id": nullable(count()), "n_images": count(),
               "n_vision_tokens": count(), "mrope": boolean(),
               "images_field": nullable(string()), "image_check": one_of("sha256", "header")})
IMAGE_COUNTS = ("n_images", "n_vision_tokens")  # in the corpus's "images", not a part's

MANIFEST_KEYS = {  # every key of PREFIX.json, documented in docs/FORMAT.md (a test checks it)
    "format": Key(one_of(FORMAT), '"packtool.tokens"'),
    "version": Key(one_of(*READABLE), "3, 4 for pairs and groups, 5 with images (1: "
                   "single-part, 2: no digests; both still read)"),
    "dtype": Key(one_of("uint16", "uint32"), "uint16 or uint32"),
    "vocab_size": Key(count(1), "the tokenizer's id space"),
    "n_docs": Key(count(), "documents"), "n_tokens": Key(count(), "tokens"),
    "n_empty": Key(count(), "zero-length documents"),
    "tokenizer": Key(obj({"path": string(), "sha256": hexstr(64)}),
                     "path and sha256 of the tokenizer file"),
    "bos_id": Key(nullable(count()), "id added before every document, or null"),
    "eos_id": Key(nullable(count()), "id added after every document, or null"),
    "inputs": Key(list_of(_INPUT), "per input file: path, kind, n_docs, content, skipped..."),
    "mask": Key(boolean(), "PREFIX.mask exists"),
    "n_trained_tokens": Key(count(), "tokens with mask 1"),
    "options": Key(obj({}), "the tokenize options"),
    "engine": Key(obj({}), "the tokenizer engine that ran and how it was checked"),
    "checksums": Key(_CHECKSUMS, "version 1 only: sha256 and bytes of each data file",
                     optional=True),
    "parts": Key(list_of(obj(PART_KEYS)), "version 2+: per part, in order: name, index, "
                 "digest, counts, inputs, checksums", optional=True),
    "plan": Key(obj({"policy": string(), "n_parts": count(1), "digest": hexstr(64),
                     "prefix": string(True)}),
                "version 2+: how the inputs were split into parts (policy, n_parts, prefix, "
                "digest)", optional=True),
    "groups": Key(_GROUPS, "version 4: {kind: pairs or completions, n_groups, "
                  "rewards}: every document a sequence of a group (.roles, .prompt)",
                  optional=True),
    "tree_field": Key(string(True), "--tree-field: the record key whose value names each "
                      "document's tree (.tree)", optional=True),
    "images": Key(_IMAGES, "version 5: {rule, min_pixels, max_pixels, patch, merge, "
                  "image_token_id, vision_start_id, vision_end_id, n_images, "
                  "n_vision_tokens, mrope, images_field, image_check}", optional=True),
    "created_by": Key(string(), '"packtool X.Y.Z"'),
    PARTS_KEY: Key(list_of(hexstr(64)), "version 3: per part, in order, the sha256 of its "
                   "own manifest .NAME.part.json (json.dumps(m, sort_keys=True)): binds the "
                   "parts' manifests to this one", optional=True),
    DIGEST_KEY: Key(hexstr(64), "version 3: sha256 of the manifest without this key",
                    optional=True),
}
# what a reader needs of each version; the documentation keys above apply to version 3
_SHA_V1 = obj({"sha256": hexstr(64), "bytes": Key(count(), "", optional=True)})
_V1 = obj({"dtype": MANIFEST_KEYS["dtype"], "n_docs": count(), "n_tokens": count(),
           "checksums": obj({"bin": _SHA_V1, "boundaries": _SHA_V1,
                             "mask": Key(_SHA_V1, "", optional=True)}),
           "tokenizer": Key(anything(), "", optional=True)})
_V2 = obj({"dtype": MANIFEST_KEYS["dtype"], "n_docs": count(), "n_tokens": count(),
           "parts": list_of(_PART_V2), "tokenizer": obj({"sha256": hexstr(64)}),
           "mask": Key(boolean(), "", optional=True), "plan": Key(obj({}), "", optional=True)})
_BOUND = {"parts": MANIFEST_KEYS["parts"].spec, "plan": MANIFEST_KEYS["plan"].spec,
          DIGEST_KEY: MANIFEST_KEYS[DIGEST_KEY].spec, PARTS_KEY: MANIFEST_KEYS[PARTS_KEY]}
_V3 = obj({k: v for k, v in MANIFEST_KEYS.items() if k not in ("checksums", "groups",
                                                                  "images")} | _BOUND)
_V4 = obj({k: v for k, v in MANIFEST_KEYS.items() if k not in ("checksums", "images")}
          | _BOUND | {"groups": _GROUPS})
_V5 = obj({k: v for k, v in MANIFEST_KEYS.items() if k not in ("checksums", "groups")}
          | _BOUND | {"images": _IMAGES})
SPECS = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5}

PART_MANIFEST_KEYS = ("format", "version", "index", "digest", "plan_digest", "part", "meta")
PART_MANIFEST = obj({"format": one_of(PART_FORMAT), "version": one_of(PART_VERSION),
                     "index": count(), "digest": hexstr(64), "plan_digest": hexstr(64),
                     "part": obj(PART_KEYS), "meta": obj({"dtype": MANIFEST_KEYS["dtype"]})})


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (ids 0..65,535), else uint32."""
    return np.dtype("<u2") if vocab_size <= UINT16_MAX_VOCAB else np.dtype("<u4")


def split_prefix(path):
    """Accept ``PREFIX`` or any of its files (``PREFIX.json``...) and return ``PREFIX`` (a
    Path; a URL stays a str)."""
    if "://" in str(path):
        s = str(path)
        for suffix in SUFFIXES:
            if s.endswith(suffix):
                return s[:-len(suffix)]
        return s
    p = Path(path)
    if p.suffix in SUFFIXES and not Path(str(p) + ".json").exists():
        return p.with_suffix("")
    return p


def prefix_paths(prefix: str | Path) -> dict[str, Path]:
    prefix = str(prefix)
    return {s[1:]: Path(prefix + s) for s in SUFFIXES}


def part_name(prefix_name: str, k: int, n_parts: int) -> str:
    """Part k's file stem: the prefix itself for a one-part corpus, else PREFIX.part-KKKKK."""
    return prefix_name if n_parts == 1 else f"{prefix_name}.part-{k:05d}"


def part_manifest_path(folder: Path, name: str) -> Path:
    return folder / f".{name}.part.json"


def plan_digest(part_digests: list[str]) -> str:
    """The plan's digest: of its parts' digests, in order."""
    return hashlib.sha256(json.dumps(part_digests, sort_keys=True).encode()).hexdigest()


def part_manifest_digest(m: dict, read: bool = False) -> str:
    """sha256 of a part's own manifest as the corpus manifest records it (``PARTS_KEY``);
    ``read``: ``m`` was read from its JSON file (else it is made what reading it gives)."""
    if not read:
        m = json.loads(json.dumps(m, ensure_ascii=False))
    return hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()


def corpus_manifest(meta: dict, parts: list[dict], plan: dict,
                    part_manifests: list[dict] | None = None) -> dict:
    """The version-3 ``PREFIX.json`` of ``parts`` (entries in order) around the caller's
    ``meta`` (dtype, tokenizer, options, engine...): totals are the parts' sums, the digests
    of the parts' own manifests (``part_manifests``, as on disk), and its own digest last."""
    from .._manifest import seal

    with_mask = "mask" in parts[0]["checksums"] if parts else False
    grouped = bool(parts) and "roles" in parts[0]["checksums"]
    version = GROUPED_VERSION if grouped else VERSION
    if "images" in meta:  # the settings every part was made with, and the totals
        version = IMAGES_VERSION
        meta = {**meta, "images": {**meta["images"], **{
            k: sum(q.get(k, 0) for q in parts) for k in IMAGE_COUNTS}}}
    if grouped:  # what kind: from the options that made it
        o = meta.get("options", {})
        meta = {**meta, "groups": {"kind": "pairs" if o.get("chosen_field") else "completions",
                                   "n_groups": sum(q["n_groups"] for q in parts),
                                   "rewards": "rewards" in parts[0]["checksums"]}}
    if parts and "tree" in parts[0]["checksums"]:
        meta = {**meta, "tree_field": meta.get("options", {}).get("tree_field")}
    manifest = {"format": FORMAT, "version": version, **meta,
                "n_docs": sum(q["n_docs"] for q in parts),
                "n_tokens": sum(q["n_tokens"] for q in parts),
                "n_empty": sum(q["n_empty"] for q in parts), "mask": with_mask,
                "n_trained_tokens": sum(q["n_trained_tokens"] for q in parts),
                "inputs": [i for q in parts for i in q["inputs"]],
                "parts": parts, "plan": plan, "created_by": f"packtool {__version__}"}
    if part_manifests is not None:
        manifest[PARTS_KEY] = [part_manifest_digest(m) for m in part_manifests]
    for q in parts:
        if set(q) - set(PART_KEYS):
            raise RuntimeError(f"part keys not in the schema: {sorted(set(q) - set(PART_KEYS))}")
    return seal(manifest, MANIFEST_KEYS, DIGEST_KEY, "manifest")
