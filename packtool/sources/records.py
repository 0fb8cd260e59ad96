"""One record of an input: what it contributed (:class:`InputStats`), how to read it
(:class:`ReadOptions`), and the checks that make a bad record a :class:`BadRecord` naming
what is wrong (the reader adds the file and line, or counts it with ``--skip-bad-records``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import PacktoolError

DEFAULT_MAX_RECORD_BYTES = 64 << 20
# Tokenizing one record takes up to about this many times its size in memory, above the
# process's baseline (the tokenizers library's per-token structures and the reader's copies):
# measured by scripts/bench_record_memory.py for 4/8/16 MB records, both engines: prose
# 88-148x, Japanese 146-205x (16 MB: 3.4 GB peak RSS); text of a token every 1.5 bytes
# ("a, a, ...") ~310x. The limit above keeps a stray giant record from taking the machine down.
MEMORY_PER_RECORD_BYTE = 210


@dataclass
class InputStats:
    """What one input file contributed; goes into the manifest."""

    path: str
    kind: str
    n_docs: int = 0
    record: int = 0  # number (line or row) of the record last yielded, for messages
    blank_lines: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_records: list[int] = field(default_factory=list)
    content: dict | None = None  # bytes and crc32 of the file as read

    def skip(self, record: int, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.skipped_records.append(record)

    def to_json(self) -> dict:
        d = {"path": self.path, "kind": self.kind, "n_docs": self.n_docs}
        if self.content is not None:
            d["content"] = self.content
        if self.blank_lines:
            d["blank_lines"] = self.blank_lines
        if self.skipped:
            d["skipped"] = self.skipped
            d["skipped_records"] = self.skipped_records
        return d


@dataclass
class ReadOptions:
    text_field: str = "text"
    txt_split: str = "file"
    skip_bad_records: bool = False
    parquet_batch_rows: int = 8192       # at most; fewer when rows are long (PARQUET_BATCH_BYTES)
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    prompt_field: str | None = None       # with completion_field: SFT prompt/completion pairs
    completion_field: str | None = None
    messages_field: str | None = None     # chat conversations: [{"role", "content"}, ...]
    render: Callable | None = None        # renders a conversation here, in the reader, so a
    #                                       failure is a bad record of a known file and line
    chosen_field: str | None = None       # pairs and groups: packtool.sources.groups
    rejected_field: str | None = None
    completions_field: str | None = None
    rewards_field: str | None = None
    tree_field: str | None = None         # a record's tree id (Tagged), for pack --share-prefix
    render_prompt: Callable | None = None  # a chat prompt, rendered with the generation prompt
    group: Callable | None = None          # (record, self) -> its GroupRecord
    images_field: str | None = None        # --vision: a list of the record's images
    vision: Callable | None = None         # (record, self) -> its packtool.vision VisionDoc

    @property
    def fields(self) -> list[str]:
        """The record fields this mode reads (a Parquet reader selects their columns)."""
        tree = [self.tree_field] if self.tree_field else []
        if self.mode == "text":
            return [self.text_field, *tree] + ([self.images_field] if self.images_field else [])
        return [f for f in (self.prompt_field, self.completion_field, self.messages_field,
                            self.chosen_field, self.rejected_field, self.completions_field,
                            self.rewards_field, self.images_field) if f] + tree

    @property
    def plain_text(self) -> bool:
        """Text records with nothing else to read (no tree id, no images): the readers' fast
        paths hand on the bare string."""
        return self.mode == "text" and self.vision is None and self.tree_field is None

    @property
    def mode(self) -> str:
        if self.chosen_field or self.completions_field:
            return "pairs" if self.chosen_field else "completions"
        if self.messages_field:
            return "messages"
        if self.prompt_field or self.completion_field:
            return "prompt_completion"
        return "text"

    def extract(self, obj):
        """The record's document: a str, a (prompt, completion) pair, or a message list
        (with ``tree_field``, :class:`Tagged` with its tree id)."""
        if self.vision is not None:  # images found, sized, their placeholders made
            return self.vision(obj, self)  # (--tree-field with --vision: refused by name)
        doc = self._extract(obj)
        if self.tree_field is None:
            return doc
        return Tagged(doc, tree_id(get_field(obj, self.tree_field), self.tree_field))

    def _extract(self, obj):
        if self.mode == "text":
            return check_text(get_field(obj, self.text_field), self.text_field)
        if self.mode == "prompt_completion":
            return (check_text(get_field(obj, self.prompt_field), self.prompt_field),
                    check_text(get_field(obj, self.completion_field), self.completion_field))
        try:  # a group (.groups.extract_group, set by the caller), or a conversation rendered
            if self.mode in ("pairs", "completions"):
                return self.group(obj, self)
            messages = check_messages(get_field(obj, self.messages_field), self.messages_field)
            return messages if self.render is None else self.render(messages)
        except PacktoolError as e:  # the template refused this prompt or conversation
            raise BadRecord(getattr(e, "reason", "chat_template"), str(e)) from None


@dataclass(frozen=True)
class Tagged:
    """A record's document and its tree id (``--tree-field``)."""

    doc: object
    tree: int

    def utf8_size(self) -> int:
        return utf8_size(self.doc)


def tree_id(value, key: str) -> int:
    """A tree id (any JSON value but null) as 64 bits: the first 8 bytes of the blake2b of
    its canonical JSON, little-endian (equal ids, equal numbers; docs/FORMAT.md)."""
    import hashlib
    import json

    if value is None:
        raise BadRecord("missing_field", f"field {key!r} (--tree-field) is null")
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class BadRecord(Exception):
    def __init__(self, reason: str, message: str):
        self.reason, self.message = reason, message

    def hint(self) -> str:
        """The fix, unless the message already names it."""
        if self.reason in ("missing_field", "too_large"):
            return ""
        return "; fix the record or pass --skip-bad-records"


def counted(path, unit: str, records, skip: bool, stats: InputStats):
    """The documents of a reader's ``records`` (``(number, document or BadRecord)`` in
    order), counted into ``stats``: a bad record skipped and counted (``skip``), else an
    error naming the file and the ``unit`` (line, row) it is."""
    for number, doc in records:
        if not isinstance(doc, BadRecord):
            stats.n_docs += 1
            stats.record = number
            yield doc
        elif skip:
            stats.skip(number, doc.reason)
        else:
            raise PacktoolError(f"{path} {unit} {number}: {doc.message}{doc.hint()}")


def too_large(size: int, limit: int) -> BadRecord:
    return BadRecord(
        "too_large",
        f"record is {size:,} bytes, over --max-record-bytes {limit:,} (tokenizing takes about "
        f"{MEMORY_PER_RECORD_BYTE}x a record's size in memory); raise --max-record-bytes if the "
        "machine has the memory, split the record, or pass --skip-bad-records",
    )


def utf8_size(doc) -> int:
    """A record's size in UTF-8 bytes: a text, a (prompt, completion) pair or messages."""
    if isinstance(doc, str):
        return len(doc) if doc.isascii() else len(doc.encode("utf-8", "surrogatepass"))
    if hasattr(doc, "utf8_size"):  # a pair or group (packtool.sources.groups)
        return doc.utf8_size()
    if isinstance(doc, tuple):  # (prompt, completion), or (rendered text, trained spans)
        return sum(utf8_size(x) for x in doc if isinstance(x, str))
    return sum(utf8_size(m["content"]) + utf8_size(m["role"]) for m in doc)


def read_lines(f, limit: int):
    """``(line, size)`` for each line of ``f``; ``line`` is None when the line (without its
    newline) is over ``limit`` bytes: the rest of it is read and dropped in 1 MiB pieces."""
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield line, len(line)
            continue
        size = len(line)
        while True:
            piece = f.readline(1 << 20)
            size += len(piece)
            if not piece or piece.endswith(b"\n"):
                break
        yield None, size - piece.endswith(b"\n")


def get_field(obj, key: str):
    """``obj[key]``, or with dots a nested lookup (``meta.body``); a literal dotted key wins."""
    if not isinstance(obj, dict):
        raise BadRecord("not_an_object", f"record is a JSON {json_type(obj)}, not an object")
    if key in obj:
        return obj[key]
    cur, walked = obj, []
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            where = ".".join(walked) or "the record"
            keys = ", ".join(repr(k) for k in cur) if isinstance(cur, dict) else type(cur).__name__
            raise BadRecord(
                "missing_field",
                f"no field {key!r} (keys in {where}: {keys or 'none'}); "
                "name the right key with --text-field (or --prompt-field, --completion-field, "
                "--messages-field, --chosen-field, --rejected-field, --completions-field, "
                "--rewards-field)",
            )
        walked.append(part)
        cur = cur[part]
    return cur


JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number",
               bool: "boolean", type(None): "null"}


def json_type(v) -> str:
    return JSON_TYPES.get(type(v), type(v).__name__)


def check_text(value, key: str) -> str:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:  # JSON "\ud800" escapes decode to lone surrogates
            raise BadRecord("invalid_unicode", f"field {key!r} holds a lone surrogate "
                             f"(U+{ord(value[e.start]):04X} at character {e.start})") from None
        return value
    raise BadRecord("not_a_string", f"field {key!r} is {json_type(value)}, expected a string")


def check_messages(value, key: str) -> list[dict]:
    if not isinstance(value, list):
        raise BadRecord("bad_messages",
                         f"field {key!r} is {json_type(value)}, expected an array of messages")
    if not value:
        raise BadRecord("bad_messages", f"field {key!r} is an empty conversation")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise BadRecord("bad_messages",
                             f"message {i} is a {json_type(m)}, expected an object")
        for k in ("role", "content"):
            if k not in m:
                keys = ", ".join(map(repr, m))
                raise BadRecord("bad_messages", f"message {i} has no {k!r} (keys: {keys})")
        if not isinstance(m["role"], str):
            raise BadRecord("bad_messages",
                             f"message {i} 'role' is {json_type(m['role'])}, expected a string")
        check_text(m["role"], f"message {i} role")
        content = m["content"]
        if isinstance(content, str):
            check_text(content, f"message {i} content")
        elif isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            for j, part in enumerate(content):
                check_part(part, f"message {i} content part {j}")
        else:
            raise BadRecord("bad_messages", f"message {i} 'content' is {json_type(content)}, "
                             "expected a string or a list of text parts")
    return value


def check_part(part, where: str) -> None:
    if not isinstance(part, dict):
        raise BadRecord("bad_messages", f"{where} is a {json_type(part)}, expected an object "
                         '{"type": "text", "text": ...}')
    if "type" not in part:
        keys = ", ".join(map(repr, part)) or "none"
        raise BadRecord("bad_messages", f"{where} has no 'type' (keys: {keys})")
    if part["type"] != "text":
        raise BadRecord("bad_parts", f"{where} has type {part['type']!r}; only text parts can "
                         "be tokenized (drop the other parts, or describe them in text)")
    if not isinstance(part.get("text"), str):
        raise BadRecord("bad_messages", f"{where} 'text' is {json_type(part.get('text'))}, "
                         "expected a string")
    check_text(part["text"], f"{where} text")


def corrupt(path, kind: str, e: Exception) -> PacktoolError:
    return PacktoolError(
        f"{path}: corrupt or truncated {kind} file ({type(e).__name__}: {e}); "
        "re-download or re-compress it"
    )
