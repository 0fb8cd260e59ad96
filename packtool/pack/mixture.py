"""Mixtures and held-out splits, from lengths alone: which copies of which documents the
training packs use (``PREFIX:FACTOR``: 2.0 = every document twice, 0.5 = a seeded half) and
which whole documents are held out for validation. Pure functions of the inputs and the
options, so ``verify`` recomputes them (with its own code) to check a dataset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import PacktoolError
from .plan import PackOptions

MAX_FACTOR = 1000  # a larger factor packs every document over 1,000 times: a typo, not a mix


def parse_source(spec: str) -> tuple[str, float]:
    """``PREFIX`` or ``PREFIX:FACTOR`` (``web:2.0``, ``books:0.5``) -> (prefix, factor)."""
    head, sep, tail = str(spec).rpartition(":")
    if sep and head:
        try:
            factor = float(tail)
        except ValueError:
            return str(spec), 1.0
        if not (0 <= factor <= MAX_FACTOR) or factor != factor:
            raise PacktoolError(
                f"{spec}: repeat factor {tail} must be a number from 0 to {MAX_FACTOR:,} (2.0 = "
                "every document twice, 0.5 = a seeded half, 0 = none in training); a factor "
                f"of {tail} would pack every document {tail} times")
        return head, factor
    return str(spec), 1.0


def resolve_source(spec: str) -> tuple[str, float]:
    """:func:`parse_source`, checked against the files there (local paths): ``c:2`` when
    both ``c.json`` and ``c:2.json`` exist is refused as ambiguous; ``c:2`` with no ``c``
    says that ``:2`` was read as a factor; a raw input (``prose.jsonl``) points to
    ``packtool tokenize``."""
    from ..formats.tokens import split_prefix
    from ..storage import local_file

    prefix, factor = parse_source(spec)
    if local_file(spec) is None:
        return prefix, factor
    if prefix != str(spec):
        whole = _whole(spec, prefix, "repeat factor", factor, "PREFIX:FACTOR to repeat it")
        return (str(spec), 1.0) if whole else (prefix, factor)
    whole = Path(f"{split_prefix(spec)}.json")
    if not whole.exists() and Path(spec).is_file():
        raise PacktoolError(
            f"{spec} is not token files (no {whole.name}): pack takes the --out PREFIX of "
            f"packtool tokenize; tokenize it first: packtool tokenize {spec} --tokenizer "
            f"TOKENIZER --out PREFIX, then packtool pack PREFIX")
    return prefix, factor


def _whole(spec: str, prefix: str, what: str, value: float, form: str) -> bool:
    """Whether the files there make ``spec`` a corpus of its own (True) rather than the
    corpus ``prefix`` with a ``what`` of ``value`` (False); both, or neither, refused."""
    from ..formats.tokens import split_prefix

    whole, head = Path(f"{split_prefix(spec)}.json"), Path(f"{split_prefix(prefix)}.json")
    if whole.exists() and head.exists():
        raise PacktoolError(f"{spec} is ambiguous: {whole} (the corpus {spec}) and {head} (the "
                            f"corpus {prefix} with {what} {value:g}) both exist; rename one of "
                            "them")
    if not whole.exists() and not head.exists():
        raise PacktoolError(f"{head} not found: in {spec}, '{spec[len(prefix):]}' was read as "
                            f"a {what} of the corpus {prefix}; give the --out PREFIX of "
                            f"packtool tokenize ({form})")
    return whole.exists()


def _sub_seed(seed: int, domain: int, k: int) -> np.random.Generator:
    """The held-out (1) or extra-copy (2) stream of source k (packtool.seeds)."""
    from .. import seeds

    return seeds.rng(seed, {1: "mixture.held_out", 2: "mixture.repeats"}[domain], k)


def holdout_counts(nonempty: list[int], valid_docs: int | None = None,
                   valid_fraction: float | None = None) -> list[int]:
    """How many of each source's non-empty documents are held out. Never a source's last
    one: a source keeps at least one document for training. ``valid_docs``: exactly that many
    in all, apportioned in proportion to the sources' non-empty documents (largest remainder,
    ties to the earlier source; what a capped source cannot give goes to the others);
    ``valid_fraction``: round(fraction x m) of each source's m, at least 1 where m >= 2::

        --valid-docs 1 over c (50 documents) and b (1):  c 1, b 0   (1 in all, b still trains)
        --valid-fraction 0.999999 over c (50):           c 49       (one left for training)
    """
    if valid_docs is not None and valid_fraction is not None:
        raise PacktoolError("give --valid-docs or --valid-fraction, not both")
    m = [int(x) for x in nonempty]
    cap = [max(x - 1, 0) for x in m]
    if valid_fraction is not None:
        if not 0 < valid_fraction < 1:
            raise PacktoolError(f"--valid-fraction {valid_fraction}: must be above 0 and "
                                "below 1")
        return [min(max(1, round(valid_fraction * x)), c) if x >= 2 else 0
                for x, c in zip(m, cap, strict=True)]
    if valid_docs is None:
        return [0] * len(m)
    if not cap or sum(cap) < 1:
        raise PacktoolError(
            f"--valid-docs {valid_docs}: no document can be held out: the sources hold "
            f"{sum(m):,} non-empty document(s) and each keeps at least one for training; "
            "drop --valid-docs or add documents")
    if not 1 <= valid_docs <= sum(cap):
        raise PacktoolError(f"--valid-docs {valid_docs}: must be from 1 to {sum(cap):,} (the "
                            "non-empty documents, less one per source for training)")
    counts, left = [0] * len(m), valid_docs
    while left:  # each round either places all that is left or fills a source to its cap
        room = [k for k in range(len(m)) if counts[k] < cap[k]]
        weight = sum(m[k] for k in room)
        quota = {k: divmod(left * m[k], weight) for k in room}
        rest = left - sum(q for q, _ in quota.values())
        for k in sorted(room, key=lambda k: -quota[k][1])[:rest]:  # stable: earlier first
            quota[k] = (quota[k][0] + 1, 0)
        for k in room:
            add = min(quota[k][0], cap[k] - counts[k])
            counts[k] += add
            left -= add
    return counts


def held_out(lengths: np.ndarray, sizes: list[int], seed: int, valid_docs: int | None = None,
             valid_fraction: float | None = None) -> np.ndarray:
    """Boolean mask of the documents held out for validation: whole non-empty documents, a
    seeded sample of each source of :func:`holdout_counts` of them."""
    mask = np.zeros(lengths.size, bool)
    if valid_docs is None and valid_fraction is None:
        return mask
    nonempty = lengths > 0
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    counts = holdout_counts([int(nonempty[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:],
                                                                      strict=True)],
                            valid_docs, valid_fraction)
    for k, want in enumerate(counts):
        if want:
            base = int(bounds[k])
            docs = base + np.flatnonzero(nonempty[base:int(bounds[k + 1])])
            mask[_sub_seed(seed, 1, k).choice(docs, size=want, replace=False)] = True
    return mask


def doc_repeats(sizes: list[int], factors: list[float], seed: int,
                exclude: np.ndarray | None = None) -> np.ndarray:
    """How many copies of each document a mixture uses: floor(factor) of every document, plus
    one more for a seeded sample of round(frac(factor) * n) of them (``exclude``d documents,
    e.g. held-out ones, get none and are not sampled)."""
    reps = np.zeros(int(sum(sizes)), np.int64)
    base = 0
    for k, (n, factor) in enumerate(zip(sizes, factors, strict=True)):
        whole, frac = int(factor), factor - int(factor)
        eligible = np.arange(base, base + n)
        if exclude is not None:
            eligible = eligible[~exclude[base:base + n]]
        reps[eligible] = whole
        extra = round(frac * eligible.size)
        if extra:
            reps[_sub_seed(seed, 2, k).choice(eligible, size=extra, replace=False)] += 1
        base += n
    return reps


def mixture_plan(lengths: np.ndarray, sizes: list[int], factors: list[float],
                 options: PackOptions, names: list[str] | None = None
                 ) -> tuple[np.ndarray | None, np.ndarray]:
    """(copies per document for the training packs, or None for "each once"; held-out mask).
    A pure function of the inputs and options: ``verify`` recomputes it to check a pack.
    Refused (:func:`refuse_idle`): an empty training set, or a source that adds nothing."""
    valid = held_out(lengths, sizes, options.seed, options.valid_docs, options.valid_fraction)
    reps = None if all(f == 1 for f in factors) and not valid.any() else doc_repeats(
        sizes, factors, options.seed, exclude=valid)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    trained, nonempty = [], []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        used = lengths[a:b] > 0
        nonempty.append(int(used.sum()))
        trained.append(int((used & (reps[a:b] > 0)).sum()) if reps is not None else nonempty[-1])
    refuse_idle(trained, nonempty, factors, names)
    return reps, valid


def refuse_idle(trained: list[int], nonempty: list[int], factors: list[float],
                names: list[str] | None = None) -> None:
    """An empty training set is refused, and so is a source that adds no document to it
    (its factor rounds to no copy, or it holds no non-empty document): unless asked for,
    with factor 0 (``PREFIX:0``: held-out documents only, or none)."""
    for k, (t, m, f) in enumerate(zip(trained, nonempty, factors, strict=True)):
        name = names[k] if names else f"source {k + 1} (in the order given)"
        if f > 0 and not t:
            why = ("it holds no non-empty document" if not m else
                   f"factor {f:g} selects none of its {m:,} non-empty documents")
            fix = "" if not m else f"raise its factor ({1 / m:.3g} selects one document), "
            raise PacktoolError(
                f"{name} would add nothing to the training packs: {why}; {fix}drop it, or "
                f"give it as {names[k] if names else 'PREFIX'}:0 to keep it out of training on "
                "purpose")
    if not sum(trained):
        raise PacktoolError(
            "the training set would be empty (no document of any source is packed for "
            "training: factors 0, or every document held out); raise a factor or hold out "
            "fewer documents")


# -- target token shares: PREFIX=SHARE -----------------------------------------------------
# ``web=0.7 code=0.3`` asks for 70% / 30% of the packed tokens; the planner turns shares into
# the repeat factors above (so verify, --group-docs and the index work as for factors), with
# the total set by --tokens N or by the scarcest source (none repeated).

SHARE_TRIES = 16  # samples tried per source for its fractional part: the closest is kept


def parse_share(spec: str) -> tuple[str, float] | None:
    """``PREFIX=SHARE`` -> (prefix, share); None when ``spec`` has no ``=NUMBER`` tail."""
    head, sep, tail = str(spec).rpartition("=")
    if not (sep and head):
        return None
    try:
        share = float(tail)
    except ValueError:
        return None
    if not share >= 0 or share == float("inf"):
        raise PacktoolError(f"{spec}: target share {tail} must be a number >= 0 (web=0.7 "
                            "code=0.3: 70% and 30% of the packed tokens; 0 = none in training)")
    return head, share


def resolve_share(spec: str) -> tuple[str, float] | None:
    """:func:`parse_share`, checked against the files there as :func:`resolve_source` checks
    ``PREFIX:FACTOR`` (a corpus named ``c=0.5`` is a corpus, not a share)."""
    from ..storage import local_file

    parsed = parse_share(spec)
    if parsed is None or local_file(spec) is None:
        return parsed
    return None if _whole(spec, parsed[0], "target share", parsed[1], "PREFIX=SHARE") else parsed


def resolve_sources(prefixes, tokens: int | None = None):
    """(prefix and repeat factor per source, target shares or None): every source as
    ``PREFIX[:FACTOR]``, or every source as ``PREFIX=SHARE``; a mix is refused by name."""
    shares = [resolve_share(p) for p in prefixes]
    if not any(shares):
        if tokens is not None:
            raise PacktoolError(f"--tokens {tokens:,} sets the total of target shares: give "
                                "the sources as PREFIX=SHARE (web=0.7 code=0.3); repeat "
                                "factors (PREFIX:FACTOR) set each source's tokens themselves")
        return [resolve_source(p) for p in prefixes], None
    others = [str(p) for p, s in zip(prefixes, shares, strict=True) if s is None]
    if others:
        raise PacktoolError(
            f"{', '.join(others)} {'has' if len(others) == 1 else 'have'} no target share "
            "while other sources do: give every source a share of the packed tokens "
            "(PREFIX=SHARE, web=0.7 code=0.3; PREFIX=0 for none in training) or every "
            "source a repeat factor (PREFIX:FACTOR), not both")
    if not sum(s for _, s in shares):
        raise PacktoolError("the target shares sum to 0: give at least one source a share "
                            "above 0")
    return [(p, 1.0) for p, _ in shares], [s for _, s in shares]


def share_factors(lengths: np.ndarray, sizes: list[int], shares: list[float],
                  options: PackOptions, names: list[str]) -> list[float]:
    """Repeat factors that pack each source's share of the tokens (held-out documents apart,
    lengths after --overflow): of ``options.tokens`` in all, or of the largest total no
    source repeats for (the scarcest source whole, factor 1). A factor's fractional part
    selects a seeded sample of documents (:func:`doc_repeats`); of SHARE_TRIES sample sizes
    around the expected one, the one whose tokens come closest is kept, so a share is met to
    about a document's tokens, not to the sample's spread."""
    from fractions import Fraction

    valid = held_out(lengths, sizes, options.seed, options.valid_docs, options.valid_fraction)
    eff = _packed_lengths(lengths, options)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    have = [int(eff[a:b][~valid[a:b]].sum()) for a, b in zip(bounds[:-1], bounds[1:],
                                                              strict=True)]
    want = [Fraction(repr(s)) / sum(Fraction(repr(x)) for x in shares) for s in shares]
    for k, (w, h) in enumerate(zip(want, have, strict=True)):
        if w and not h:
            raise PacktoolError(f"{names[k]} has no tokens to give its target share "
                                f"{shares[k]:g} (no non-empty document for training); drop it "
                                f"or give it as {names[k]}=0")
    total = Fraction(options.tokens) if options.tokens else min(
        Fraction(h) / w for w, h in zip(want, have, strict=True) if w)
    factors = []
    for k, w in enumerate(want):
        a, b = int(bounds[k]), int(bounds[k + 1])
        eligible = np.arange(a, b)[~valid[a:b]]
        factors.append(_factor(eff, eligible, w * total, options.seed, k, names[k]) if w
                       else 0.0)
    return factors


def _packed_lengths(lengths: np.ndarray, options: PackOptions) -> np.ndarray:
    """Tokens each document gives the packs under --overflow (split keeps them all)."""
    x = np.asarray(lengths, np.int64)
    if options.overflow == "truncate":
        return np.minimum(x, options.seq_len)
    if options.overflow == "drop":
        return np.where(x > options.seq_len, 0, x)
    return x


def _factor(eff: np.ndarray, eligible: np.ndarray, target, seed: int, k: int,
            name: str) -> float:
    """Source k's repeat factor for ``target`` tokens (a Fraction) of its ``eligible``
    documents: whole copies, then the sample size whose draw comes closest."""
    have, m = int(eff[eligible].sum()), eligible.size
    whole, rest = divmod(target, have)
    whole = int(whole)
    if whole + 1 > MAX_FACTOR:
        raise PacktoolError(f"{name}: its target share of --tokens is {float(target):,.0f} "
                            f"tokens, {float(target / have):,.0f} times its {have:,}; at most "
                            f"{MAX_FACTOR:,} copies: lower --tokens or its share")
    best, gap, mean, tried = 0, rest, have / m, set()
    e = min(m, int(round(rest * m / have)))
    for _ in range(SHARE_TRIES if rest else 0):
        got = int(eff[_sub_seed(seed, 2, k).choice(eligible, size=e, replace=False)].sum()) \
            if e else 0
        tried.add(e)
        if abs(got - rest) < abs(gap):
            best, gap = e, got - rest
        way = 1 if got < rest else -1
        e = min(m, max(0, e + (int(round(float(rest - got) / mean)) or way)))
        while e in tried and 0 <= e + way <= m:  # each size draws another sample: a new try
            e += way
        if got == rest or e in tried:
            break
    if not whole and not best:
        raise PacktoolError(f"{name}: its target share is {float(target):,.0f} tokens, less "
                            f"than one of its documents gives (mean {mean:,.0f} tokens); raise "
                            "its share or --tokens")
    return whole + best / m
