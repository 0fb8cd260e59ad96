"""The ``packtool`` command: a thin click layer over the library (:mod:`.app` the group and
its error handling, :mod:`.options` options built from the option dataclasses,
:mod:`.commands` the commands, :mod:`.which` packtool which).

:mod:`.demo` ``packtool demo`` (the bundled corpus end to end).
"""

from . import commands  # noqa: F401 - registers the commands on the group
from .app import cli, main
from .commands import demo, export, pack, stats, tokenize, verify
from .which import which

__all__ = ["cli", "demo", "export", "main", "pack", "stats", "tokenize", "verify", "which"]
