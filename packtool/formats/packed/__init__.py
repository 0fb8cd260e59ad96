"""The packed format (``packtool.packed``, version 2; version 1 read): what ``pack`` writes
and ``open_packed`` reads. Schema (``schema.py``), the layout's arithmetic (``layout.py``),
writer (``writer.py``), its files opened and checked (``files.py``), the one reader
(``reader.py``), the validator (``validate.py``), the proof that a folder is a dataset of
packtool's own (``ownership.py``); the files are written up in docs/FORMAT.md.

What a row costs and how rows reach a model, beside the format they describe (the reader
stores them, the packers, ``stats`` and the trainer use them): ``costs.py`` the cost classes
stored with the index, ``balance.py`` steps of like attention cost (the cost model: classes,
like-cost order, dealing, ``step_imbalance``), ``batching.py`` packs collated into one
``[1, N]`` row and padded (``collate_numpy``, ``pad_example``), ``groups.py`` a grouped
pack's extra keys (pairs and groups), ``images.py`` a row's images and mRoPE ids, read from its
source corpora.
"""

from .._manifest import digest as _digest
from .files import (
    Shard,
    ValidationError,
    check_crc,
    load_array,
    open_sources_of,
    read_index,
    source_location,
)
from .layout import attention_costs, derive, labels_from, pack_offsets, token_ends, v1_segments
from .reader import PackedReader, open_packed
from .schema import (
    DIGEST_KEY,
    FORMAT,
    IGNORE_INDEX,
    INDEX,
    INDEX_KEYS,
    LAYOUTS,
    SCHEMA,
    V1_SCHEMA,
    VALID,
    VERSION,
    mask_storage,
    shard_arrays,
    v2_dtypes,
)
from .validate import validate_packed
from .writer import ShardWriter, index, shard_name

__all__ = [
    "DIGEST_KEY", "FORMAT", "IGNORE_INDEX", "INDEX", "INDEX_KEYS", "LAYOUTS", "SCHEMA",
    "V1_SCHEMA", "VALID", "VERSION", "PackedReader", "Shard", "ShardWriter",
    "ValidationError", "attention_costs", "check_crc", "derive", "index",
    "index_digest",
    "labels_from", "load_array", "mask_storage", "open_packed", "open_sources_of", "pack_offsets",
    "read_index", "shard_arrays", "shard_name", "source_location", "token_ends",
    "v1_segments", "v2_dtypes", "validate_packed",
]


def index_digest(index: dict) -> str:
    """The ``index_sha256`` an index.json must carry (sha256 of the rest of it)."""
    return _digest(index, DIGEST_KEY)
