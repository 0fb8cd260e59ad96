"""What every packtool manifest shares: reading one (JSON, ``format``, ``version``), checking
it against its schema in one pass, its own content digest, and the rule for file names read
from it. Format modules declare their schemas with the small specs below; a manifest that
does not fit is refused by name (file, key path, what was found, what was expected, the fix)
before any of its values reaches a reader, so a bad manifest is never a traceback::

    corpus.json: parts[3].checksums.bin.sha256 is 123, expected a 64-digit hex string;
    re-run packtool tokenize

Specs are plain callables ``spec(value) -> None or "what was expected"`` built by the
helpers here (``count()``, ``hexstr(64)``, ``obj({...})``, ...); ``Key`` adds the
documentation that docs/FORMAT.md must carry (a test checks it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import FormatError

Spec = Callable[[object], "str | None"]


@dataclass(frozen=True)
class Key:
    """One manifest key: its spec, its documentation, and whether it may be absent."""

    spec: Spec
    doc: str
    optional: bool = False


class _Bad(Exception):
    def __init__(self, path: str, value, expected: str):
        super().__init__(path)
        self.path, self.value, self.expected = path, value, expected


def _show(value) -> str:
    text = json.dumps(value) if not isinstance(value, str | int | float | bool) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def manifest_text(value, ensure_ascii: bool = True) -> str:
    """A manifest's JSON text as packtool writes it: objects indented a space a level, a list
    of scalars on one line, a list of objects or lists one compact element a line; ends with
    a newline. ``json.dumps(indent=1)`` runs Python's pure-Python encoder: for a tokenize run
    of 2,000 small files its manifests took 0.15 s of the run's CPU; here every leaf and
    list element goes through the C encoder."""
    compact = json.JSONEncoder(ensure_ascii=ensure_ascii, separators=(", ", ": ")).encode

    def emit(x, pad: str) -> str:
        if isinstance(x, dict) and x and all(isinstance(k, str) for k in x):
            inner = pad + " "
            return ("{\n" + ",\n".join(f"{inner}{compact(k)}: {emit(v, inner)}"
                                        for k, v in x.items()) + f"\n{pad}}}")
        if isinstance(x, list | tuple) and any(isinstance(e, dict | list | tuple) for e in x):
            inner = pad + " "
            return "[\n" + ",\n".join(inner + compact(e) for e in x) + f"\n{pad}]"
        return compact(x)

    return emit(value, "") + "\n"


# ------------------------------------------------------------------------------ the specs
def anything() -> Spec:
    return lambda v: None


def count(lo: int = 0, hi: int | None = None) -> Spec:
    what = f"a count (an integer >= {lo:,}" + (f" and < {hi:,})" if hi is not None else ")")
    return lambda v: None if (type(v) is int and v >= lo and (hi is None or v < hi)) else what


def integer() -> Spec:
    return lambda v: None if type(v) is int else "an integer"


def number(lo: float | None = None, hi: float | None = None) -> Spec:
    def check(v):
        if type(v) not in (int, float) or v != v:
            return "a number"
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            return f"a number from {lo} to {hi}"
        return None
    return check


def boolean() -> Spec:
    return lambda v: None if type(v) is bool else "true or false"


def string(nonempty: bool = False) -> Spec:
    return lambda v: None if type(v) is str and (v or not nonempty) else "a string"


def hexstr(n: int) -> Spec:
    pattern = re.compile(f"[0-9a-f]{{{n}}}")
    return lambda v: (None if type(v) is str and pattern.fullmatch(v)
                      else f"a {n}-digit hex string")


def one_of(*values) -> Spec:
    return lambda v: (None if any(v == x and type(v) is type(x) for x in values)
                      else "one of " + ", ".join(map(_show, values)))


def nullable(spec: Spec) -> Spec:
    return lambda v: None if v is None else spec(v)


def list_of(spec: Spec) -> Spec:
    def check(v):
        if type(v) is not list:
            return "a list"
        for i, item in enumerate(v):
            _descend(spec, item, f"[{i}]")
        return None
    return check


def dict_of(spec: Spec) -> Spec:
    def check(v):
        if type(v) is not dict:
            return "an object"
        for k, item in v.items():
            _descend(spec, item, f".{k}")
        return None
    return check


def obj(keys: dict[str, Key | Spec], extra: bool = True) -> Spec:
    """An object with these keys (``Key(..., optional=True)`` may be absent); ``extra``:
    whether other keys are allowed (written by a newer minor version, say)."""
    keys = {k: v if isinstance(v, Key) else Key(v, "") for k, v in keys.items()}

    def check(v):
        if type(v) is not dict:
            return "an object"
        for k, key in keys.items():
            if k not in v:
                if key.optional:
                    continue
                raise _Bad(f".{k}", None, "present (the key is missing)")
            _descend(key.spec, v[k], f".{k}")
        if not extra and set(v) - set(keys):
            raise _Bad("", sorted(set(v) - set(keys)), "only the schema's keys")
        return None
    return check


def _descend(spec: Spec, value, where: str) -> None:
    try:
        problem = spec(value)
    except _Bad as e:
        raise _Bad(where + e.path, e.value, e.expected) from None
    if problem is not None:
        raise _Bad(where, value, problem)


def check(value, spec: Spec, path: Path | str, fix: str) -> None:
    """Raise :class:`FormatError` naming ``path``, the key path, what was found and what was
    expected, unless ``value`` fits ``spec``."""
    try:
        _descend(spec, value, "")
    except _Bad as e:
        where = e.path.lstrip(".") or "the manifest"
        if e.expected.startswith("present"):
            key = re.split(r"[.\[]", where)[-1]
            at = f" (at {where})" if where != key else ""
            raise FormatError(f"{path}: malformed manifest: missing key {key!r}{at}; {fix}"
                              ) from None
        raise FormatError(f"{path}: malformed manifest: {where} is {_show(e.value)}, not "
                          f"{e.expected}; {fix}") from None


# --------------------------------------------------------------------------- reading
def read_json_bytes(path, read=None) -> tuple[object, bytes]:
    """A JSON file and its bytes, refusing a symbolic link (a manifest is never followed
    elsewhere); ``read(name)`` reads a remote one (its path is then a URL)."""
    try:
        if read is not None:
            raw = read(str(path).rstrip("/").rsplit("/", 1)[-1])
        else:
            path = Path(path)
            if path.is_symlink():
                raise FormatError(f"{path} is a symbolic link; packtool reads its manifests "
                                  "only as regular files: copy the file itself")
            raw = path.read_bytes()
        return json.loads(raw.decode("utf-8")), raw
    except FileNotFoundError:
        raise FormatError(f"{path} not found; is this the output of packtool?") from None
    except (OSError, ValueError) as e:
        from ..storage import store_error

        if read is not None and (failed := store_error(e, [path])) is not None:
            raise failed from None  # the store's failure (a timeout...), not the manifest's
        raise FormatError(f"{path}: unreadable manifest ({e})") from None


def load_json(path, read=None) -> object:
    """A JSON file (see :func:`read_json_bytes`)."""
    return read_json_bytes(path, read)[0]


def read_manifest(path, expected_format: str, versions: int | tuple, read=None,
                  raw: list | None = None) -> dict:
    """A manifest of ``expected_format`` in one of ``versions``, else :class:`FormatError`
    (``read``: how a remote one is read, see :func:`read_json_bytes`; ``raw``, a list, gets
    the bytes read, whose sha256 binds what was read to what refers to it)."""
    meta, data = read_json_bytes(path, read)
    if raw is not None:
        raw.append(data)
    if not isinstance(meta, dict) or meta.get("format") != expected_format:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise FormatError(f"{path}: format is {got!r}, expected {expected_format!r}")
    versions = versions if isinstance(versions, tuple) else (versions,)
    if meta.get("version") not in versions or isinstance(meta.get("version"), bool):
        raise FormatError(
            f"{path}: {expected_format} version {meta.get('version')!r} is not supported by "
            f"this packtool (it reads version {' and '.join(map(str, versions))}); upgrade "
            "packtool or re-create the file")
    return meta


def digest(body: dict, key: str) -> str:
    """sha256 of ``body`` without ``key`` (its own digest), keys sorted: any edit of the
    manifest changes it."""
    rest = {k: v for k, v in body.items() if k != key}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def seal(body: dict, keys: dict, key: str, what: str) -> dict:
    """``body`` with its own digest under ``key``, once every key of it is one the schema
    documents (``keys``; and so docs/FORMAT.md): an undocumented key is packtool's bug."""
    if set(body) - set(keys):
        raise RuntimeError(f"{what} keys not in the schema: {sorted(set(body) - set(keys))}")
    body[key] = digest(body, key)
    return body


def check_digest(body: dict, key: str, path: Path, fix: str) -> None:
    if body.get(key) != digest(body, key):
        raise FormatError(f"{path}: content does not match its {key}; the file was modified "
                          f"or damaged; {fix}")


# ------------------------------------------------------------------------------ names
def confined_name(name, manifest: Path) -> str:
    """A file name read from a manifest: refused unless it is a plain name in the manifest's
    folder (no separator, no '..', not absolute)."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\0" in name or os.path.isabs(name)):
        raise FormatError(f"{manifest}: file name {name!r} is not a plain name inside "
                          f"{manifest.parent}; refusing to open it")
    return name


def confined_file(path: Path, manifest: Path) -> Path:
    """A data file a manifest names (``path`` = its folder / a confined name): refused when
    it is a symbolic link that leaves the folder. The file itself is checked, whatever its
    name; the same rule for every file of every format."""
    if path.is_symlink():
        folder = manifest.parent.resolve()
        if folder not in path.resolve().parents:
            raise FormatError(f"{manifest}: {path.name!r} is a symbolic link out of "
                              f"{manifest.parent}; refusing to open it")
    return path
