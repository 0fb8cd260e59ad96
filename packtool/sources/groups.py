"""Preference pairs and groups of completions, read from a record: one prompt and its
completions, each a sequence the trainer scores (``tokenize --chosen-field C
--rejected-field R`` or ``--completions-field F``, the prompt from ``--prompt-field`` or a
chat in ``--messages-field``). A record that cannot be one (a missing or empty field, a
list where a string is due, rewards that do not match the completions) is a
:class:`~packtool.sources.records.BadRecord`, which the reader turns into an error naming
the file and line, as for every other bad record.

Roles are stored per sequence as small codes (``ROLE_CODES``): 1 chosen, 2 rejected, 3 + k
completion k; 0 is kept for a prompt stored once (``pack --share-prompt``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .records import BadRecord, check_messages, check_text, get_field, json_type

PROMPT, CHOSEN, REJECTED, FIRST_COMPLETION = 0, 1, 2, 3
MAX_COMPLETIONS = 65_535 - FIRST_COMPLETION  # roles are stored as uint16


def role_name(code: int):
    """A stored role code as a trainer names it: "prompt", "chosen", "rejected", or the
    completion's index in its group (an int)."""
    code = int(code)
    if code >= FIRST_COMPLETION:
        return code - FIRST_COMPLETION
    return ("prompt", "chosen", "rejected")[code]


@dataclass(frozen=True)
class GroupRecord:
    """One record's group: its prompt (text, or a chat rendered with the generation prompt),
    its completions in order, their role codes, and their rewards (or None)."""

    prompt: str
    completions: tuple[str, ...]
    roles: tuple[int, ...]
    rewards: tuple[float, ...] | None = None

    def utf8_size(self) -> int:
        return sum(len(s.encode("utf-8", "surrogatepass"))
                   for s in (self.prompt, *self.completions))


def nonempty(value, key: str) -> str:
    text = check_text(value, key)
    if not text:
        raise BadRecord("empty_field", f"field {key!r} is empty; a preference or group record "
                        "needs a non-empty prompt and completions")
    return text


def extract_group(obj, opts) -> GroupRecord:
    """The group of record ``obj`` under ``opts`` (a :class:`ReadOptions` in a group mode)."""
    if opts.messages_field:
        messages = check_messages(get_field(obj, opts.messages_field), opts.messages_field)
        prompt = opts.render_prompt(messages)
        if not prompt:
            raise BadRecord("empty_field", f"field {opts.messages_field!r} renders to an empty "
                            "prompt")
    else:
        prompt = nonempty(get_field(obj, opts.prompt_field), opts.prompt_field)
    if opts.chosen_field:
        completions = (nonempty(get_field(obj, opts.chosen_field), opts.chosen_field),
                       nonempty(get_field(obj, opts.rejected_field), opts.rejected_field))
        return GroupRecord(prompt, completions, (CHOSEN, REJECTED))
    key = opts.completions_field
    items = get_field(obj, key)
    if not isinstance(items, list) or not items:
        what = "an empty list" if isinstance(items, list) else json_type(items)
        raise BadRecord("bad_completions", f"field {key!r} is {what}, expected a non-empty "
                        "list of completion strings")
    if len(items) > MAX_COMPLETIONS:
        raise BadRecord("bad_completions", f"field {key!r} holds {len(items):,} completions, "
                        f"over {MAX_COMPLETIONS:,} a group")
    completions = tuple(nonempty(c, f"{key}[{i}]") for i, c in enumerate(items))
    rewards = None
    if opts.rewards_field:
        rewards = _rewards(get_field(obj, opts.rewards_field), opts.rewards_field,
                           len(completions))
    return GroupRecord(prompt, completions,
                       tuple(FIRST_COMPLETION + i for i in range(len(completions))), rewards)


def _rewards(value, key: str, n: int) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise BadRecord("bad_rewards", f"field {key!r} is {json_type(value)}, expected a list "
                        f"of {n} numbers (one per completion)")
    if len(value) != n:
        raise BadRecord("bad_rewards", f"field {key!r} holds {len(value)} rewards for {n} "
                        "completions; give one per completion")
    out = []
    for i, r in enumerate(value):
        try:  # an int of 400 digits is finite to JSON and too large for a float
            f = float(r) if isinstance(r, (int, float)) and not isinstance(r, bool) else None
        except OverflowError:
            f = None
        if f is None or not math.isfinite(f):
            shown = repr(r) if len(repr(r)) <= 40 else f"{repr(r)[:12]}... ({len(repr(r))} chars)"
            raise BadRecord("bad_rewards", f"{key}[{i}] is {shown}, expected a finite number "
                            "(a float64)")
        out.append(f)
    return tuple(out)
