"""``--vsl MIN:MAX`` as an option: its parsing and the pack options it cannot honour (the
cut itself: :mod:`packtool.pack.vsl`)."""

from __future__ import annotations

from .errors import PacktoolError


def parse_vsl(spec) -> tuple[int, int] | None:
    """(MIN, MAX) of ``--vsl MIN:MAX`` (a string, or a pair from the library), checked:
    powers of two, 1 <= MIN <= MAX < 2**31. None stays None."""
    if spec is None:
        return None
    if isinstance(spec, str):
        lo_s, sep, hi_s = spec.partition(":")
        if not sep or not lo_s.strip().isdigit() or not hi_s.strip().isdigit():
            raise PacktoolError(f"--vsl {spec!r}: give MIN:MAX, two powers of two (e.g. "
                                "--vsl 256:8192)")
        lo, hi = int(lo_s), int(hi_s)
    else:
        try:
            lo, hi = (int(v) for v in spec)
        except (TypeError, ValueError):
            raise PacktoolError(f"vsl={spec!r}: give (MIN, MAX) or 'MIN:MAX'") from None
    for name, v in (("MIN", lo), ("MAX", hi)):
        if v < 1 or v >= 2**31 or v & (v - 1):
            up = 1 << max(int(v) - 1, 0).bit_length()
            raise PacktoolError(f"--vsl {lo}:{hi}: {name} {v:,} is not a power of two from 1 to "
                                f"2**30; use {max(up >> 1, 1):,} or {min(up, 2**30):,}")
    if lo > hi:
        raise PacktoolError(f"--vsl {lo}:{hi}: MIN {lo:,} > MAX {hi:,}; use --vsl {hi}:{lo}")
    return lo, hi


def vsl_conflicts(options) -> list[str]:
    """The pack options ``--vsl`` cannot honour, each with its fix."""
    lo, hi = options.vsl_bounds
    out = []
    if options.seq_len != hi:
        out.append(f"--seq-len {options.seq_len:,} is not --vsl's MAX {hi:,} (a vsl row holds "
                   f"at most MAX tokens): drop --seq-len or pass --seq-len {hi}")
    if options.algo != "bfd":
        out.append(f"--algo {options.algo}: --vsl packs its remnants with bfd (as Dataset "
                   "Decomposition does) and every chunk alone; drop --algo")
    if options.overflow != "split":
        out.append(f"--overflow {options.overflow}: --vsl cuts every document into chunks, "
                   "none is truncated or dropped; drop --overflow")
    for flag in ("align", "cp", "tp", "pad_id", "max_docs", "max_depth", "work_limit",
                 "time_limit", "group_docs"):
        if getattr(options, flag) is not None:
            out.append(f"--{flag.replace('_', '-')}: not with --vsl (a chunk row is one "
                       "unpadded segment, remnant rows are bfd's); drop it")
    for flag in ("sequence_parallel", "fp8"):
        if getattr(options, flag):
            out.append(f"--{flag.replace('_', '-')}: not with --vsl (rows are not aligned); "
                       "drop it")
    if options.balance != "none":
        out.append("--balance attention: not with --vsl (a row's cost follows its length; "
                   "batch rows of one length instead); drop it")
    return out
