"""The held-out rule as ``verify`` states it, in its own plain code (exact fractions), apart
from the writer's :func:`packtool.pack.mixture.holdout_counts`: a bug in one cannot vouch for
itself. How many non-empty documents of each source ``k`` (``m[k]`` of them) a dataset's
``held_out`` entry holds out, by the rule it records (docs/FORMAT.md):

- rule 2 (``"rule": 2``): never a source's last document (cap ``m - 1``). ``valid_fraction f``:
  ``round(f * m)``, at least 1 where ``m >= 2``, at most the cap. ``valid_docs N``: exactly
  N, each source's exact share ``N * m / M`` over the sources with room (``M`` their
  documents), floored, the remainder one each to the largest fractions (the earlier source
  first on a tie), a source over its cap cut to it and the cut shared out again;
- rule 1 (absent; datasets before it): ``min(max(1, round(share * m)), m)`` where ``share``
  is ``f``, or ``N / all documents`` (empty ones included).
"""

from __future__ import annotations

from fractions import Fraction


def expected_holdout(held: dict, nonempty: list[int], n_docs: int) -> list[int]:
    """Documents held out per source, by the rule ``held`` (an index's ``held_out``) names."""
    if held.get("rule", 1) == 1:
        share = (held["valid_fraction"] if held.get("valid_fraction") is not None
                 else held["valid_docs"] / n_docs)
        return [min(max(1, round(share * m)), m) if m else 0 for m in nonempty]
    cap = [max(m - 1, 0) for m in nonempty]
    if held.get("valid_fraction") is not None:
        f = held["valid_fraction"]
        return [min(max(1, round(f * m)), c) if m >= 2 else 0
                for m, c in zip(nonempty, cap, strict=True)]
    got = [0] * len(nonempty)
    left = int(held["valid_docs"])
    while left > 0:
        room = [k for k in range(len(got)) if got[k] < cap[k]]
        if not room:
            break  # more than the sources can give: the writer refuses it
        total = sum(nonempty[k] for k in room)
        exact = {k: Fraction(left * nonempty[k], total) for k in room}
        give = {k: int(exact[k]) for k in room}
        by_fraction = sorted(room, key=lambda k: (-(exact[k] - give[k]), k))
        for k in by_fraction[:left - sum(give.values())]:
            give[k] += 1
        for k in room:
            take = min(give[k], cap[k] - got[k])
            got[k] += take
            left -= take
    return got
