"""``pack --out s3://...``: the dataset is packed in a local staging folder, then published
(:mod:`packtool.storage.publish`): shards first, each verified, ``valid/index.json`` and
``index.json`` last. Sources may be URLs too (read through the cache)."""

from __future__ import annotations

import json
import re

from ..errors import FormatError, PacktoolError
from ..formats._manifest import check_digest
from ..formats.packed import DIGEST_KEY, FORMAT, INDEX, VALID, index_digest
from ..storage import relative
from ..storage import stage_out as so
from ..storage.place import Place

_OURS = re.compile(rf"^(?:{VALID}/)?(?:shard-[0-9]+(?:-v?[0-9]+)?\.[a-z_]+\.npy|{INDEX})$")


def ours(name: str) -> bool:
    """Objects a packed dataset is made of (shards, its indexes): what publishing may remove
    when the new index does not list them."""
    return bool(_OURS.match(name))


def _existing_ok(url: str, overwrite: bool):
    def check(raw: bytes) -> None:
        if not overwrite:
            raise PacktoolError(f"output already exists: {url}/{INDEX}; pass --overwrite to "
                                "replace it")
        try:
            index = json.loads(raw)
            if not isinstance(index, dict) or index.get("format") != FORMAT:
                raise ValueError("not a packed dataset's index")
            check_digest(index, DIGEST_KEY, f"{url}/{INDEX}", "")
        except (ValueError, FormatError) as e:
            raise PacktoolError(f"{url}/{INDEX} is not a packtool index ({e}); --overwrite "
                                "replaces only packtool's own output") from None
    return check


def _refuse_foreign(place: Place, url: str, overwrite: bool) -> None:
    """Before the work: an index there needs --overwrite; objects there that are not a packed
    dataset's are never mixed with one."""
    names = [p[len(place.root) + 1:] for p in place.fs.find(place.root)]
    if INDEX in names and not overwrite:
        raise PacktoolError(f"output already exists: {url}/{INDEX}; pass --overwrite to "
                            "replace it")
    foreign = sorted(n for n in names if not ours(n) and not n.startswith("."))
    if foreign:
        raise PacktoolError(f"--out {url} holds objects that are not a packed dataset's "
                            f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); "
                            "write the dataset to a folder of its own")


def relocate(index: dict, url: str, folder: str) -> dict:
    """The index as published at ``folder``: each source's path relative to it (None where
    there is none: another bucket, or a local source), the digest recomputed."""
    body = dict(index)
    body["sources"] = [{**s, "path": relative(s["prefix"], folder)} for s in index["sources"]]
    body[DIGEST_KEY] = index_digest(body)
    return body


def pack_to_store(pack_fn, prefixes, url: str, options, *, overwrite, progress,
                  verify_sources, run):
    url = so.require_url(url)
    so.refuse_distributed(url, run)
    place = Place(url)
    _refuse_foreign(place, url, overwrite)
    root = so.staging_root(url)
    try:
        local = so.local_name(url, root)
        result = pack_fn(prefixes, local, options, overwrite=False, progress=progress,
                         verify_sources=verify_sources, run=run)
        files, manifests = [], []
        for sub, folder in (("", url), (VALID, f"{url}/{VALID}")):
            path = local / sub / INDEX
            if not path.is_file():
                continue
            index = relocate(json.loads(path.read_text()), url, folder)
            path.write_text(json.dumps(index, indent=1))
            files += [f"{sub + '/' if sub else ''}{f['name']}" for sh in index["shards"]
                      for f in sh["files"].values()]
            manifests.insert(0, f"{sub + '/' if sub else ''}{INDEX}")
        from ..storage.publish import publish

        done = publish(local, files, manifests, place, ".packtool.lock", ours,
                       _existing_ok(url, overwrite))
    finally:
        so.cleanup(root)
    result.out = url
    result.published = done.note()
    return result
