"""The token-file format (``packtool.tokens``, version 3; 4 with pairs and groups, 5 with
images): what ``packtool tokenize`` writes
and ``open_tokens`` reads. Schema (``schema.py``), writer (``writer.py``), reader and
validator (``reader.py``) in one package, and the proof that files at a prefix are
packtool's own (``ownership.py``); the layout is in docs/FORMAT.md.

A corpus is one or more *parts*, in order; each part is three files sharing the part's name::

    NAME.bin         token ids back to back, little-endian uint16 if vocab_size <= 65,536
                     else uint32; np.memmap(NAME.bin, dtype="<u2") reads it.
    NAME.boundaries  little-endian int64, one entry per document of the part: its cumulative
                     end offset in NAME.bin (LOCAL to the part). Document i is
                     bin[ends[i-1]:ends[i]] (ends[-1] = 0).
    NAME.mask        uint8 per token, 1 = trained on (SFT/chat corpora only).
    NAME.images ...  version 5: per document its images' end, per image its grid, token
                     span and reference (.img_grid, .img_span, .img_ref.jsonl), per token
                     its 3-D position (.pos3); see docs/FORMAT.md
    .NAME.part.json  the part's own manifest (its entry, digest, plan digest): written last
                     by the part's writer, so a part is finished when it exists and matches.
    PREFIX.json      the manifest: format, version, dtype, totals, tokenizer sha256, inputs,
                     options, ``parts`` (name, position, digest, counts, sha256 of each file)
                     and its own digest. Renamed into place last.

A one-part corpus names its part after the prefix (PREFIX.bin: version 1's layout); a corpus
of K > 1 parts names them ``PREFIX.part-00000`` ... Parts are independent (local
boundaries), so each is written, checked and resumed alone; concatenating the parts' .bin
(and .mask) gives a one-part run's file byte for byte. Versions 1 and 2 stay readable.

Zero-length documents keep their entry, so document index = input record index.

``groups.py``: a corpus of pairs or groups, its group structure checked and laid out for
the packer.
"""

from .corpus import (
    TokenCorpus,
    TokenPart,
    gather,
    read_lengths,
    read_lengths_range,
    verify_part_files,
)
from .reader import (
    check_boundaries,
    open_part,
    open_tokens,
    read_corpus_manifest,
    read_part_manifest,
    validate_tokens,
)
from .schema import (
    DATA_SUFFIXES,
    DIGEST_KEY,
    FORMAT,
    MANIFEST_KEYS,
    PART_FORMAT,
    PART_KEYS,
    PART_MANIFEST_KEYS,
    PART_VERSION,
    READABLE,
    SCHEMA,
    SUFFIXES,
    UINT16_MAX_VOCAB,
    VERSION,
    corpus_manifest,
    part_manifest_path,
    part_name,
    plan_digest,
    prefix_paths,
    split_prefix,
    token_dtype,
)
from .writer import TokenWriter

__all__ = [
    "DATA_SUFFIXES", "DIGEST_KEY", "FORMAT", "MANIFEST_KEYS", "PART_FORMAT", "PART_KEYS",
    "PART_MANIFEST_KEYS", "PART_VERSION",
    "READABLE", "SCHEMA", "SUFFIXES", "UINT16_MAX_VOCAB", "VERSION", "TokenCorpus",
    "TokenPart", "TokenWriter", "check_boundaries", "corpus_manifest", "gather", "open_part",
    "open_tokens", "part_manifest_path", "part_name", "plan_digest", "prefix_paths",
    "read_corpus_manifest", "read_lengths", "read_lengths_range", "read_part_manifest",
    "split_prefix", "token_dtype",
    "validate_tokens", "verify_part_files",
]
