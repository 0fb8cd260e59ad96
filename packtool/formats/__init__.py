"""On-disk formats, one module each: schema, writer (which emits its own manifest), reader
and validator live together, so adding an array or a manifest key is one edit.

- :mod:`packtool.formats.tokens`  ``packtool.tokens``: what ``tokenize`` writes
- :mod:`packtool.formats.packed`  ``packtool.packed``: what ``pack`` writes
"""
