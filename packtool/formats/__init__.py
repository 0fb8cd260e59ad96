"""packtool's own on-disk formats, one package each: schema, writer (which emits its own
manifest), reader and validator live together, so adding an array or a manifest key is one
edit.

- :mod:`packtool.formats.tokens`  ``packtool.tokens``: what ``tokenize`` writes
- :mod:`packtool.formats.packed`  ``packtool.packed``: what ``pack`` writes

The trainers' formats that ``export`` writes are not here: :mod:`packtool.export` has their
writers only; their readers are the trainers' libraries (docs/EXPORT.md).

Shared by both: ``_manifest`` (reading a manifest, its schema check, its digest, the rule
for file names in it) and ``_kernels`` (the numba gather kernels, apart so that opening a
dataset does not import numba).
"""
