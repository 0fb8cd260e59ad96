"""packtool: raw text corpora to packed, padding-free LLM training data.

    tokens = packtool.open_tokens("out/corpus")          # after `packtool tokenize`
"""

__version__ = "0.1.0"

from .errors import FormatError, PacktoolError
from .tokenfile import TokenCorpus, open_tokens

__all__ = ["FormatError", "PacktoolError", "TokenCorpus", "open_tokens", "__version__"]
