"""An epoch's steps computed one at a time: which packs global step ``s`` holds, which step
holds pack ``p``, and what the first ``s`` steps consumed, without the epoch in memory.

Each cost class ``k`` (one class without balance) of ``m_k`` packs has an order of its own, a
keyed permutation of its packs (:class:`packtool.train.permute.Feistel`, keyed by seed, epoch
and class): class position ``i`` -> the class's pack ``members_k[perm_k(i)]``. The classes
share one time line: position ``i`` of class ``k`` comes at ``t_k(i) = (i W + o_k) // m_k``
(``W = 2^31``, ``o_k`` a random phase in ``[0, W)``), so every class is spread evenly over the
epoch, each from its own random start::

    class 0 (m=6)   0     1     2     3     4     5            t_k(i) rises with i:
    class 1 (m=3)      0           1           2               a class is consumed in order,
    class 2 (m=2)            0                 1               a prefix of its positions

After a resume that consumed ``D_k`` of each class, at ``G`` packs a step, class ``k`` gives
``f_k = (m_k - D_k) // G`` *full steps*: its positions ``D_k + jG .. D_k + (j+1)G - 1``, the
step's time that of its last pack (the queue of the class fills then: the outlier delay of
:mod:`packtool.formats.packed.balance`). Full steps run in order of time (ties: lower class first);
the ``(m_k - D_k) % G`` positions each class has left (fewer than a step) follow in time
order, cut into steps of ``G``: with ``drop_last`` the last ``rest % G`` are left out, without
it the last step is filled with the epoch's first packs on the time line again.

Step ``s``'s time is found by bisection over ``[0, W)`` of the count of full steps up to a
time (one division per class: 31 rounds over ~60 classes, ~0.3 ms), its class by the ties at
that time; a pack's step by the inverse permutation and the same count. Nothing is the size
of the epoch: at 2.5 x 10^8 packs a step is microseconds and a few hundred bytes (the
leftovers, fewer than ``G`` a class, are the only list held). Without balance there is one
class and step ``s`` is positions ``D + sG ..`` of one permutation: the order of
``torch.utils.data.DistributedSampler``, computed per step. Under the same shape a resume
deals the same steps as the uninterrupted run: removing whole steps of a class from its front
moves no other step's time.
"""

from __future__ import annotations

import numpy as np

from ..errors import PacktoolError
from .permute import ROUNDS, Feistel
from .schedule import least_step

W = 1 << 31  # the time line: t_k(i) < W for every class, and (x + 1) * m_k < 2^62


def class_keys(seed: int, epoch: int, n_classes: int) -> list[np.ndarray]:
    """Per class, ``ROUNDS`` Feistel keys then its phase ``o_k``: the seed's stream
    'sampler.epoch' of ``[seed, epoch, k]`` (packtool.seeds), the same on every rank."""
    from ..seeds import rng

    return [rng(seed, "sampler.epoch", epoch, k).integers(0, 1 << 63, ROUNDS + 1,
                                                          dtype=np.uint64)
            for k in range(n_classes)]


class EpochOrder:
    """The steps of one epoch from a resume point: ``rows(a, b)`` -> packs [b - a, G] of the
    steps ``a..b`` counted from the resume point, ``places(pack)`` -> its (step, slot)s.

    ``sizes``: packs per class; ``members``: the packs grouped by class, ascending within one
    (None: one class, pack = position, no array); ``done``: packs consumed per class."""

    def __init__(self, sizes: np.ndarray, members, keys: list, g: int, done: np.ndarray,
                 drop_last: bool):
        self.sizes = np.asarray(sizes, np.int64)
        if len(self.sizes) > 1 and int(self.sizes.max()) > W:
            raise PacktoolError(f"a cost class of {int(self.sizes.max()):,} packs: the "
                                f"balanced sampler orders at most {W:,} packs a class; "
                                "use a smaller cost_ratio or balance=None")
        self.members, self.g, self.drop_last = members, int(g), bool(drop_last)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.perms = [Feistel(m, k[:ROUNDS]) for m, k in zip(self.sizes.tolist(), keys,
                                                              strict=True)]
        self.phase = np.array([int(k[ROUNDS]) % W for k in keys], np.int64)
        self.done = np.asarray(done, np.int64)
        rest = self.sizes - self.done
        self.full = rest // self.g        # full steps per class
        self.n_full = int(self.full.sum())
        self.left = self._leftovers()     # (class, position) in time order, [L, 2]
        q, r = divmod(len(self.left), self.g)
        self.n_steps = self.n_full + q + (1 if r and not self.drop_last else 0)
        self.n_dealt = (self.n_steps - self.n_full) * self.g  # leftover slots incl. the fill

    # ------------------------------------------------------------------ the time line

    def time(self, k, i):
        """t_k(i), vectorised over classes ``k`` and positions ``i``."""
        k = np.asarray(k, np.int64)
        return (np.asarray(i, np.int64) * W + self.phase[k]) // self.sizes[k]

    def _full_upto(self, x: int) -> np.ndarray:
        """Per class, its full steps whose time is <= x (the last position of full step j is
        ``D_k + (j+1)G - 1``; ``t_k(i) <= x`` iff ``i W < (x+1) m_k - o_k``)."""
        last = ((x + 1) * self.sizes - self.phase - 1) // W  # last position with time <= x
        return np.clip((last - self.done + 1) // self.g, 0, self.full)

    def _time_of_full(self, s: int) -> int:
        """The time of full step ``s`` (0-based): the least x with s + 1 full steps <= x."""
        return least_step(0, lambda x: int(self._full_upto(x).sum()) >= s + 1, W - 1)

    def _full_before(self, s: int) -> np.ndarray:
        """Per class, its full steps among the first ``s``."""
        if s <= 0:
            return np.zeros(len(self.sizes), np.int64)
        if s >= self.n_full:
            return self.full.copy()
        if len(self.sizes) == 1:  # one class: its steps in order, no time line needed
            return np.array([s], np.int64)
        x = self._time_of_full(s)  # step s's time: steps before it are < x, or = x of a
        before, at = self._full_upto(x - 1), self._full_upto(x)  # lower class
        extra = s - int(before.sum())
        tie = np.flatnonzero(at > before)[:extra]
        before[tie] += 1
        return before

    def _full_rows(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(class, first position) of full steps a..b (b <= n_full)."""
        k, j = _ranges(self._full_before(a), self._full_before(b))
        first = self.done[k] + j * self.g
        order = np.lexsort((k, self.time(k, first + self.g - 1)))
        return k[order], first[order]

    def full_step_of(self, k: int, j: int) -> int:
        """The index of class k's full step j among all full steps."""
        if len(self.sizes) == 1:
            return j
        x = int(self.time(k, self.done[k] + (j + 1) * self.g - 1))
        at, before = self._full_upto(x), self._full_upto(x - 1)
        return int(at[:k].sum() + before[k:].sum())

    def _in_time(self, lo, hi) -> np.ndarray:
        """(class, position) of every class's positions ``lo_k..hi_k``, in time order (ties:
        lower class), [n, 2]."""
        k, i = _ranges(lo, hi)
        order = np.lexsort((k, self.time(k, i))) if len(self.sizes) > 1 else slice(None)
        return np.stack([k[order], i[order]], axis=1)

    def _leftovers(self) -> np.ndarray:
        """Every class's positions after its full steps, in time order (ties: lower class)."""
        return self._in_time(self.done + self.full * self.g, self.sizes)

    def head(self, t: int) -> np.ndarray:
        """The epoch's first ``t`` (class, position) on the time line, from position 0 of
        every class, again from the first when ``t`` exceeds the epoch (np.resize)."""
        return np.resize(self._in_time(np.zeros_like(self.sizes), np.minimum(self.sizes, t)),
                         (t, 2))

    def timeline(self) -> np.ndarray:
        """Every pack of the epoch in time order (n int64: for tests and small epochs)."""
        return self.packs(*self._in_time(np.zeros_like(self.sizes), self.sizes).T)

    # ------------------------------------------------------------------ packs

    def packs(self, k: np.ndarray, i: np.ndarray) -> np.ndarray:
        """Pack ids of positions ``i`` of classes ``k``."""
        k, i = np.asarray(k, np.int64), np.asarray(i, np.int64)
        out = np.empty(len(i), np.int64)
        for c in np.unique(k).tolist():
            sel = k == c
            local = self.perms[c].perm(i[sel])
            out[sel] = local if self.members is None else \
                np.asarray(self.members[self.starts[c] + local], np.int64)
        return out

    def _left_slots(self, a: int, b: int) -> np.ndarray:
        """(class, position) of leftover slots a..b, the fill from the epoch's head after."""
        n_left = len(self.left)
        got = self.left[a:min(b, n_left)]
        if b > n_left:
            got = np.concatenate([got, self.head(b - n_left)[max(a, n_left) - n_left:]])
        return got

    def rows(self, a: int, b: int, classes: bool = False):
        """Packs [b - a, G] of steps a..b (counted from the resume point), in slot order; with
        ``classes``, also the class of every slot."""
        a, b = max(0, a), min(b, self.n_steps)
        ks, pos = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]  # (class, position) a slot
        if a < min(b, self.n_full):
            k, first = self._full_rows(a, min(b, self.n_full))
            ks.append(np.repeat(k, self.g))
            pos.append((first[:, None] + np.arange(self.g)).ravel())
        if b > max(a, self.n_full):
            lo, hi = (max(a, self.n_full) - self.n_full) * self.g, (b - self.n_full) * self.g
            kc = self._left_slots(lo, hi)
            ks.append(kc[:, 0])
            pos.append(kc[:, 1])
        k = np.concatenate(ks)
        out = self.packs(k, np.concatenate(pos)).reshape(-1, self.g)
        return (out, k.reshape(-1, self.g)) if classes else out

    def left_out(self) -> np.ndarray:
        """Packs no step takes (drop_last: the last leftovers, fewer than a step)."""
        kc = self.left[self.n_dealt:]
        return self.packs(kc[:, 0], kc[:, 1])

    def consumed(self, s: int) -> np.ndarray:
        """Packs per class consumed after steps 0..s of this order (fill slots counted as the
        class of the pack they repeat, as a step takes them)."""
        out = self.done + self._full_before(s) * self.g
        if s > self.n_full:
            kc = self._left_slots(0, (min(s, self.n_steps) - self.n_full) * self.g)
            out = out + np.bincount(kc[:, 0], minlength=len(self.sizes))
        return out

    def places(self, pack: int, k: int, local: int) -> list[tuple[int, int]]:
        """Every (step, slot) holding ``pack`` (of class ``k``, its ``local``-th member):
        none if consumed before the resume or left out; two if it also fills the last step."""
        i = int(self.perms[k].inverse([local])[0])
        out = []
        d = int(self.done[k])
        if d <= i < d + int(self.full[k]) * self.g:
            j, slot = divmod(i - d, self.g)
            out.append((self.full_step_of(k, j), slot))
        elif i >= d:
            at = np.flatnonzero((self.left[:, 0] == k) & (self.left[:, 1] == i))
            if len(at) and at[0] < self.n_dealt:
                step, slot = divmod(int(at[0]), self.g)
                out.append((self.n_full + step, slot))
        fill = self.n_dealt - len(self.left)
        if fill > 0:
            kc = self.head(fill)
            for h in np.flatnonzero((kc[:, 0] == k) & (kc[:, 1] == i)).tolist():
                out.append((self.n_steps - 1, len(self.left) % self.g + h))
        return out


def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(class, position) of the positions ``lo[k]..hi[k]`` of every class k, class by class."""
    k = np.repeat(np.arange(len(lo)), hi - lo)
    i = np.concatenate([np.arange(a, b) for a, b in zip(lo.tolist(), hi.tolist(),
                                                         strict=True)] or [[]])
    return k, i.astype(np.int64)
