"""Document lengths from elsewhere: ``.npy`` arrays and ``length,count`` histogram CSVs.

The reference histograms of the Graphcore packing paper ship in ``packtool/data/``
(``wikipedia-512``, ``squad11-384``); a histogram is a full description of a dataset for a
packer that only looks at lengths.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .errors import PacktoolError

DATA = Path(__file__).resolve().parent / "data"


def reference_histogram(name: str) -> Path:
    path = DATA / f"{name}.histogram.csv"
    if not path.is_file():
        have = ", ".join(p.name.split(".")[0] for p in DATA.glob("*.histogram.csv"))
        raise PacktoolError(f"no reference histogram {name!r}; bundled: {have}")
    return path


MAX_HISTOGRAM_DOCS = 1 << 30  # 8 GiB of int64 lengths once expanded


def load_histogram_csv(path: str | Path, max_docs: int = MAX_HISTOGRAM_DOCS) -> np.ndarray:
    """Expand a ``length,count`` CSV into one length per document (numpy.repeat).

    The header line is optional: a first line of two integers is data, not a header (skipping
    it unread dropped a row). The total count is checked before expanding: a count of 1e12
    once tried to allocate 7 TiB."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            first = f.readline().split(b",")
        header = len(first) != 2 or not all(x.strip().isdigit() for x in first)
        with warnings.catch_warnings():  # an empty file: said below, not as numpy's warning
            warnings.simplefilter("ignore", UserWarning)
            rows = np.loadtxt(path, delimiter=",", skiprows=int(header), dtype=np.int64,
                              ndmin=2)
    except (OSError, ValueError) as e:
        raise PacktoolError(f"{path}: not a 'length,count' CSV ({e})") from None
    if rows.size == 0:
        return np.empty(0, np.int64)
    if rows.shape[1] != 2 or (rows < 0).any():
        raise PacktoolError(f"{path}: expected two non-negative integer columns length,count")
    total = sum(int(c) for c in rows[:, 1])
    if total > max_docs:
        raise PacktoolError(
            f"{path}: the counts add up to {total:,} documents, over the limit of {max_docs:,} "
            f"({8 * total / 2**30:,.0f} GiB as lengths); scale the counts down (the packers' "
            "ratios depend on the shape of the histogram, not its scale)"
        )
    return np.repeat(rows[:, 0], rows[:, 1])


def load_lengths(path: str | Path) -> np.ndarray:
    """Lengths from a ``.npy`` (1-D integers) or a ``length,count`` histogram ``.csv``; one
    that holds no document is refused (a report on nothing would say nothing true)."""
    path = Path(path)
    arr = load_histogram_csv(path) if path.suffix == ".csv" else _load_npy(path)
    if arr.size == 0:
        raise PacktoolError(f"{path} holds no document lengths; give a .npy of lengths or a "
                            "length,count CSV with at least one document")
    return arr


def _load_npy(path: Path) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise PacktoolError(f"{path}: not a readable .npy of lengths ({e})") from None
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer) or (arr < 0).any():
        raise PacktoolError(f"{path}: expected a 1-D array of non-negative integer lengths")
    return arr.astype(np.int64)
