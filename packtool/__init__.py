"""packtool: raw text corpora to packed, padding-free LLM training data.

    corpus = packtool.open_tokens("out/corpus")            # after `packtool tokenize`
    packs = packtool.assign_packs(corpus.lengths, 4096)     # pack id per document
    ds = packtool.open_packed("out/packed")                 # after `packtool pack`
    row = packtool.collate_numpy([ds[0], ds[1]])            # one [1, N] varlen row
    plan = packtool.plan_step(lengths, max_tokens=16384, world_size=8)  # inside an RL step

Everything loads on first use, so ``packtool --help`` starts without numba, scipy, pyarrow.

Layers, bottom to top: a module imports only from its own layer or below, and no two
packages import each other through any chain (``tests/test_layers.py`` reads this table and
checks every import, lazy ones included)::

    0  packtool errors
    1  _crc _io _signals _numba _progress seeds bounds lengths metrics
       conflicts chat
    2  storage
    3  sources vision
    4  formats
    5  engines packers
    6  options executors
    7  tokenize pack stats verify export
    8  train torch
    9  cli __main__

- 0: ``packtool`` (this file: the version, the lazy names above) and ``errors`` (PacktoolError).
- 1: no packtool concepts: ``_crc`` crc32, ``_io`` reads and digests, ``_signals`` Ctrl-C
  and SIGTERM, ``_numba`` every numba option and compile, ``_progress`` progress bars, ``seeds``
  the random streams, ``bounds``/``lengths``/``metrics`` packing arithmetic, ``conflicts``
  which features cannot be used together (one table), ``chat`` chat templates.
- 2: ``storage``: local folders and buckets behind one interface, chosen once
  (``open_output``), and the local commit (``atomic``, ``flock``).
- 3: ``sources``: the input readers (txt, jsonl, parquet, pairs and groups); ``vision``
  images: their size from the header, vision tokens per model, mRoPE positions.
- 4: ``formats``: packtool's own formats (``tokens``, ``packed``), each with schema, writer,
  reader and validator, and what the packed format's rows cost and how they collate.
- 5: ``engines`` the tokenizer loader and engines; ``packers`` the packing algorithms.
- 6: ``options`` every stage's options; ``executors`` run a stage's jobs here or on Ray.
- 7: the stages: ``tokenize``, ``pack``, ``stats``, ``verify``, ``export``.
- 8: ``train`` the training side (samplers, preference losses, torch), ``torch`` its public
  name.
- 9: ``cli`` the command line, ``__main__`` its entry point.
"""

__version__ = "0.1.0"

from .errors import FormatError, PacktoolError

_LAZY = {
    "open_tokens": "formats.tokens",
    "TokenCorpus": "formats.tokens",
    "open_packed": "formats.packed",
    "PackedReader": "formats.packed",
    "collate_numpy": "formats.packed.batching",
    "plan_step": "train.step",
    "StepPlan": "train.step",
    "assign_packs": "packers",
    "run_packer": "packers",
    "PackerOptions": "packers",
    "PACKERS": "packers",
    "PackOptions": "options",
    "plan_pack": "pack.plan",
    "pack_corpus": "pack",
    "TokenizeOptions": "options",
    "tokenize_files": "tokenize",
    "RunOptions": "executors",
    "verify_packed": "verify",
}
# ``pack`` and ``verify`` are not here: they are submodules too, and importing a submodule
# sets the package's attribute to it, so ``packtool.pack`` would be the function or the
# module depending on import order. The functions: ``from packtool.pack import pack``,
# ``from packtool.verify import verify`` (or ``pack_corpus``, ``verify_packed`` above).

__all__ = ["FormatError", "PacktoolError", "__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'packtool' has no attribute {name!r}")
