"""The one exception type the CLI turns into a clean message and a non-zero exit."""


class PacktoolError(Exception):
    """A problem with the user's input or environment, worded so they can fix it.

    Messages name the file, the record, the value and the way out, e.g.
    ``corpus.jsonl line 17: invalid JSON (Expecting ',' delimiter); fix the line or pass
    --skip-bad-records``.
    """


class FormatError(PacktoolError):
    """A packtool file on disk is truncated, corrupt or of an unknown format version."""


def listing(names, n: int = 10) -> str:
    """The first ``n`` of ``names`` (sorted), and how many more: for a message."""
    names = sorted(names)
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")
