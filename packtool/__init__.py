"""packtool: raw text corpora to packed, padding-free LLM training data.

    corpus = packtool.open_tokens("out/corpus")            # after `packtool tokenize`
    packs = packtool.assign_packs(corpus.lengths, 4096)     # pack id per document
    ds = packtool.open_packed("out/packed")                 # after `packtool pack`
    row = packtool.collate_numpy([ds[0], ds[1]])            # one [1, N] varlen row
    plan = packtool.plan_step(lengths, max_tokens=16384, world_size=8)  # inside an RL step

Everything loads on first use, so ``packtool --help`` starts without numba, scipy, pyarrow.
"""

__version__ = "0.1.0"

from .errors import FormatError, PacktoolError

_LAZY = {
    "open_tokens": "formats.tokens",
    "TokenCorpus": "formats.tokens",
    "open_packed": "formats.packed",
    "PackedReader": "formats.packed",
    "collate_numpy": "train.batching",
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
