"""Slow, obviously-correct plain-Python references for the packers (O(n * packs))."""


def first_fit_decreasing(lengths, capacity):
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable
    room, packs = [], [-1] * len(lengths)
    for i in order:
        if lengths[i] == 0:
            continue
        for p, r in enumerate(room):  # noqa: B007 (p is the pack found when the loop breaks)
            if r >= lengths[i]:
                break
        else:
            p = len(room)
            room.append(capacity)
        room[p] -= lengths[i]
        packs[i] = p
    return packs


def best_fit_decreasing_sizes(lengths, capacity):
    """Sorted pack fills of BFD (which pack among equal-room ones is taken may differ)."""
    room = []
    for length in sorted((n for n in lengths if n), reverse=True):
        fits = [r for r in room if r >= length]
        if fits:
            room.remove(min(fits))
            room.append(min(fits) - length)
        else:
            room.append(capacity - length)
    return sorted(capacity - r for r in room)


def next_fit(lengths, order, capacity):
    packs, p, used = [-1] * len(lengths), -1, capacity
    for i in order:
        if lengths[i] == 0:
            continue
        if used + lengths[i] > capacity:
            p, used = p + 1, 0
        packs[i] = p
        used += lengths[i]
    return packs


def spfhp_sizes(lengths, capacity, max_depth, strict=False):
    """SPFHP one document at a time: lengths longest first; each document goes to the open
    pack with the most room (ties: the one changed last); documents of a length that fit
    nowhere open new packs of k = min(max_depth, L // l) documents *after* that length is
    done (as the kernel does in bulk); packs close when full or at max_depth documents."""
    from collections import Counter

    open_packs, closed, stamp = [], [], 0  # pack: [room, depth, stamp]
    for length, count in sorted(Counter(n for n in lengths if n).items(), reverse=True):
        unplaced = 0
        for _ in range(count):
            fits = [pk for pk in open_packs if pk[0] >= length]
            if not fits:
                unplaced += 1
                continue
            pk = max(fits, key=lambda q: (q[0], q[2]))
            stamp += 1
            pk[0], pk[1], pk[2] = pk[0] - length, pk[1] + 1, stamp
            if pk[0] == 0 or pk[1] >= max_depth:
                open_packs.remove(pk)
                closed.append(pk)
        while unplaced:
            stamp += 1
            k = 1 if strict else min(max_depth, capacity // length, unplaced)
            for _ in range(unplaced // k):
                pk = [capacity - k * length, k, stamp]
                (closed if pk[0] == 0 or k >= max_depth else open_packs).append(pk)
            unplaced %= k
            # the remainder first tries the packs just opened (the kernel loops again)
            while unplaced:
                fits = [pk for pk in open_packs if pk[0] >= length]
                if not fits:
                    break
                pk = max(fits, key=lambda q: (q[0], q[2]))
                stamp += 1
                pk[0], pk[1], pk[2] = pk[0] - length, pk[1] + 1, stamp
                unplaced -= 1
                if pk[0] == 0 or pk[1] >= max_depth:
                    open_packs.remove(pk)
                    closed.append(pk)
    return sorted(capacity - pk[0] for pk in open_packs + closed)


def like_cost_steps(order, cls, g):
    """Steps of ``g`` packs of one cost class, one queue per class: a pack joins its class's
    queue in epoch order and a full queue is a step; then what is left in the queues, in epoch
    order (the caller cuts it). Returns (steps, leftovers) as lists."""
    queues, steps = {}, []
    for i in order:
        q = queues.setdefault(cls[i], [])
        q.append(i)
        if len(q) == g:
            steps.append(q[:])
            q.clear()
    waiting = {i for q in queues.values() for i in q}
    return steps, [i for i in order if i in waiting]


def elastic_union(n, shapes, seed=0, costs=None, drop_last=True):
    """Run an epoch through several shapes ``[(world, batch, steps), ...]`` (steps=None: to the
    end), resuming each from the state the previous one saved; return (packs trained, in
    order, with repeats; packs left out at the end; the shape's G that ended the epoch)."""
    from packtool.train.sampler import PackSampler

    trained, state, samplers = [], None, []
    for world, batch, steps in shapes:
        ranks = [PackSampler(n, rank=r, world_size=world, batch_size=batch, seed=seed,
                             balance=costs, drop_last=drop_last) for r in range(world)]
        for s in ranks:
            s.set_epoch(1)
            if state is not None:
                s.load_state_dict(state)
        start = ranks[0].start_step
        stop = ranks[0].n_steps if steps is None else min(start + steps, ranks[0].n_steps)
        for s in ranks:
            for k, b in enumerate(s.steps(), start=start):
                if k == stop:
                    break
                trained += b
        state = ranks[0].state_dict(stop) if stop < ranks[0].n_steps else None
        samplers = ranks
        if state is None:
            break
    return trained, samplers[0].left_out().tolist(), samplers[0].global_batch


# ----------------------------------------------------- the planner and the layout, naively
def segments(lengths, seq_len, overflow):
    """(document, offset, length) of every non-empty segment, in document order."""
    out = []
    for d, n in enumerate(lengths):
        if n == 0 or (overflow == "drop" and n > seq_len):
            continue
        if overflow == "split":
            for off in range(0, n, seq_len):
                out.append((d, off, min(seq_len, n - off)))
        else:
            out.append((d, 0, min(n, seq_len)))
    return out


def order_segments(packs, rank, n_packs):
    """Entries grouped by their pack's output position, stable; segments per pack."""
    by_pos = [[] for _ in range(n_packs)]
    for s, p in enumerate(packs):
        if p >= 0:
            by_pos[rank[p]].append(s)
    return [s for group in by_pos for s in group], [len(g) for g in by_pos]


def shard_starts(pack_len, shard_size):
    """A shard closes once it holds >= shard_size tokens; every shard holds a pack."""
    starts, tokens = [0], 0
    for j, n in enumerate(pack_len):
        if tokens >= shard_size and j > starts[-1]:
            starts.append(j)
            tokens = 0
        tokens += n
    return starts + [len(pack_len)]


def derive(seg_lengths, ids, mask=None):
    """A pack's per-token arrays, one token at a time."""
    input_ids, labels, positions, doc_ids, cu = [], [], [], [], [0]
    t = 0
    for s, n in enumerate(seg_lengths):
        for j in range(n):
            input_ids.append(int(ids[t]))
            trained = mask is None or mask[t] != 0
            labels.append(int(ids[t]) if j > 0 and trained else -100)
            positions.append(j)
            doc_ids.append(s)
            t += 1
        cu.append(t)
    return {"input_ids": input_ids, "labels": labels, "position_ids": positions,
            "doc_ids": doc_ids, "cu_seqlens": cu}


def splitmix_unit(i, seed=0):
    """splitmix64 of ``i`` (plain integers, mod 2**64) as a float in [0, 1)."""
    m = (1 << 64) - 1
    z = (i * 0x9E3779B97F4A7C15 + seed) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    z ^= z >> 31
    return (z >> 11) * 2.0 ** -53


def sample_picks(sizes, first, rate, growth, budget_bytes, budget_share, seed=0):
    """The engine check's sample, one document at a time: the first ``first``, those whose
    ``splitmix_unit`` is under ``rate`` and each one more than ``growth`` times as long as the
    last so taken, each taken while the bytes checked stay within ``budget_bytes`` plus one
    in ``budget_share`` of the bytes seen up to it."""
    picked, longest, seen, checked = [], 0, 0, 0
    for i, size in enumerate(sizes):
        seen += size
        grows = size > longest * growth
        if not (i < first or splitmix_unit(i, seed) < rate or grows):
            continue
        if checked + size > budget_bytes + seen // budget_share:
            continue
        picked.append(i)
        checked += size
        if grows:
            longest = size
    return picked


def lpt(costs, world_size, batch_size):
    """Longest-processing-time dealing of one step's slots, one slot at a time: the costliest
    slot left to the least-loaded rank with room (ties: the lowest rank)."""
    load, slots = [0.0] * world_size, [[] for _ in range(world_size)]
    for j in sorted(range(len(costs)), key=lambda j: -costs[j]):  # stable: ties by position
        r = min((r for r in range(world_size) if len(slots[r]) < batch_size),
                key=lambda r: (load[r], r))
        slots[r].append(j)
        load[r] += costs[j]
    return slots


def capped_first_fit_decreasing(lengths, capacity, max_docs):
    """FFD where a pack holding ``max_docs`` documents takes no more."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable
    room, held, packs = [], [], [-1] * len(lengths)
    for i in order:
        if lengths[i] == 0:
            continue
        p = next((p for p, r in enumerate(room) if r >= lengths[i] and held[p] < max_docs),
                 None)
        if p is None:
            p = len(room)
            room.append(capacity)
            held.append(0)
        room[p] -= lengths[i]
        held[p] += 1
        packs[i] = p
    return packs


def capped_best_fit_decreasing_sizes(lengths, capacity, max_docs):
    """Sorted (fill, documents) of BFD where a pack of ``max_docs`` documents is closed; among
    packs of equal room the one that reached it last is taken (what the kernel's buckets do,
    which matters here: the packs' counts differ)."""
    open_, closed = [], []  # [room, documents], in the order each reached its room
    for length in sorted((n for n in lengths if n), reverse=True):
        fits = [k for k, (r, _) in enumerate(open_) if r >= length]
        if fits:
            best = min(open_[k][0] for k in fits)
            room, held = open_.pop(max(k for k in fits if open_[k][0] == best))
        else:
            room, held = capacity, 0
        pack = [room - length, held + 1]
        (closed if pack[1] >= max_docs else open_).append(pack)
    return sorted((capacity - r, h) for r, h in open_ + closed)


def cheapest_fit(order, tokens, costs, docs, n_bins, max_tokens, max_docs):
    """The step planner's deal: each unit of ``order`` into the cheapest bin (ties: the lowest
    bin) with room for its tokens and documents; None when one has no room anywhere."""
    fill, count, cost, out = [0] * n_bins, [0] * n_bins, [0.0] * n_bins, [-1] * len(tokens)
    for u in order:
        room = [b for b in range(n_bins)
                if fill[b] + tokens[u] <= max_tokens and count[b] + docs[u] <= max_docs]
        if not room:
            return None
        b = min(room, key=lambda b: (cost[b], b))
        fill[b] += tokens[u]
        count[b] += docs[u]
        cost[b] += costs[u]
        out[u] = b
    return out
