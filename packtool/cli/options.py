"""Click options built from the option dataclasses (:mod:`packtool.options`,
:class:`packtool.executors.RunOptions`): a field's default, check and help are defined once,
where the field is; a command lists the fields it takes, and gets the dataclass back.

    @fields(TokenizeOptions, "text_field", "eos", ...)      # adds --text-field, --eos, ...
    def tokenize(**kw):
        opts = build(TokenizeOptions, kw)                   # the fields, taken out of kw

Nothing here imports more than click (``packtool --help`` stays fast).
"""

from __future__ import annotations

import dataclasses
import re

import click


def _algo_names() -> list[str]:
    from ..packers import PACKERS  # names only: the kernels load when a packer runs

    return list(PACKERS)


class IntList(click.ParamType):
    """Integers as users type them: ``512`` or ``512,2048`` (with ``multiple``, repeated too);
    a value that reads as one number with thousands separators (``16,384``) is refused as
    ambiguous."""

    name = "N[,N...]"

    def __init__(self, lo: int, hi: int | None):
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        text = str(value).strip()
        flag = param.opts[0] if param is not None else "the option"
        if re.fullmatch(r"\d{1,3}(,\d{3})+", text):
            a, b = text.split(",", 1)
            self.fail(f"{text} reads as one number with a thousands separator or as several "
                      f"values: write {text.replace(',', '')} for one, or {flag} {a} {flag} "
                      f"{b.replace(',', f' {flag} ')} for several", param, ctx)
        out = []
        for piece in text.split(","):
            try:
                n = int(piece.strip())
            except ValueError:
                self.fail(f"{piece.strip()!r} is not an integer"
                          + (f" (in {text!r}: give integers separated by commas)"
                             if "," in text else ""), param, ctx)
            if n < self.lo or (self.hi is not None and n > self.hi):
                self.fail(f"{n} is not in the range {self.lo}<=x"
                          + (f"<={self.hi}" if self.hi is not None else ""), param, ctx)
            out.append(n)
        return tuple(out)


def flat(groups) -> tuple:
    """The values of a repeated option of comma lists, in order: ((512, 1024), (2048,)) ->
    (512, 1024, 2048)."""
    return tuple(x for g in groups for x in g)


def split_paths(values, flag: str) -> list[str]:
    """Paths as users type them: repeated (``--source a --source b``) or comma-separated
    (``--source a,b``). A value naming an existing file or prefix whole is taken whole; one
    whose whole and pieces both exist is refused as ambiguous, by name."""
    from pathlib import Path

    def there(p: str) -> bool:
        return bool(p) and (Path(p).exists() or Path(f"{p}.json").exists())

    out: list[str] = []
    for v in values:
        pieces = [x.strip() for x in v.split(",")]
        if len(pieces) == 1:
            out.append(v)
            continue
        if there(v):
            if any(there(x) for x in pieces):
                raise click.UsageError(
                    f"{flag} {v}: both {v} and {', '.join(x for x in pieces if there(x))} "
                    f"exist; rename one, or give each with its own {flag}")
            out.append(v)
            continue
        if not all(pieces):
            raise click.UsageError(f"{flag} {v}: an empty name between commas; give "
                                   f"{flag} a,b or repeat {flag}")
        out += pieces
    return out


def _click_type(spec):
    if spec in ("str", "flag", "negated_flag"):
        return None
    if spec == "path":
        return click.Path(dir_okay=False)
    if spec == "algo":
        return click.Choice(_algo_names())
    kind, *args = spec
    if kind == "ints":
        return IntList(args[0], args[1])
    if kind == "choice":
        return click.Choice(list(args[0]))
    if kind == "int":
        return click.IntRange(args[0], args[1])
    if kind == "float":  # (lo, lo_open[, hi, hi_open])
        lo, lo_open = args[0], args[1]
        hi, hi_open = (args[2], args[3]) if len(args) > 2 else (None, False)
        return click.FloatRange(lo, hi, min_open=lo_open, max_open=hi_open)
    raise ValueError(f"unknown option type {spec!r}")


def _option(f: dataclasses.Field, **override):
    cli = {**f.metadata["cli"], **override}
    flags = cli["flags"] or (f"--{f.name.replace('_', '-')}",)
    kind = cli["type"]
    kw = {"help": cli["help"]}
    if cli.get("metavar"):
        kw["metavar"] = cli["metavar"]
    if kind == "flag":
        kw["is_flag"] = True
    elif kind == "negated_flag":
        return click.option(*flags, f"no_{f.name}", is_flag=True, help=cli["help"])
    else:
        kw["type"] = _click_type(kind)
        if cli.get("required"):
            kw["required"] = True
        elif f.default is not None:
            kw["default"] = f.default
            kw["show_default"] = cli.get("show_default", False)
    if cli.get("multiple"):
        kw["multiple"] = True
        kw.pop("default", None)
    return click.option(*flags, f.name, **kw)


def _fields(cls) -> list:
    """A dataclass's fields, or those of its sections (PackOptions.option_fields)."""
    return cls.option_fields() if hasattr(cls, "option_fields") else dataclasses.fields(cls)


def fields(cls, *names: str, **overrides):
    """A decorator adding the click options of ``cls``'s fields ``names`` (in that order).
    ``overrides``: field name -> metadata to change for this command (e.g. help)."""
    by_name = {f.name: f for f in _fields(cls)}

    def decorate(fn):
        for name in reversed(names):
            fn = _option(by_name[name], **overrides.get(name, {}))(fn)
        return fn

    return decorate


def build(cls, kw: dict, **fixed):
    """``cls`` from the command's keyword arguments: each field the command took (a negated
    flag ``--no-x`` sets ``x`` False) is removed from ``kw``; ``fixed`` adds others."""
    values = dict(fixed)
    for f in _fields(cls):
        if f.name in kw:
            values[f.name] = kw.pop(f.name)
        elif f"no_{f.name}" in kw:
            values[f.name] = not kw.pop(f"no_{f.name}")
    return cls(**values)


# options every command spells the same way
overwrite_option = click.option("--overwrite", is_flag=True,
                                help="Replace an existing output (only a packtool output).")
quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary.")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print the result as JSON on stdout.")
