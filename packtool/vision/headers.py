"""An image's size from its header alone: no pixel is decoded. What a vision-token count
needs is the width and height, and every common format puts them in its first bytes::

    PNG    IHDR, bytes 16-24 (big-endian u32 width, height)
    GIF    logical screen, bytes 6-10 (little-endian u16)
    BMP    DIB header at 14: u16 pair (OS/2 core, 12 bytes) or i32 pair (height < 0: top-down)
    WebP   RIFF: VP8 (lossy key frame, 14 bits each at 26), VP8L (14 bits each after 0x2f),
           VP8X (24-bit canvas size - 1 at 24)
    JPEG   the first SOFn segment's height and width, found by walking the segments
           (length-prefixed), so an EXIF or ICC block before it costs a seek, not a read

The size is the stored one, as ``PIL.Image.open(f).size`` gives it (a JPEG's EXIF orientation
is not applied: a loader that rotates by it, ``ImageOps.exif_transpose``, swaps width and
height for orientations 5-8 and so sees another grid). A format with no size parsed here
(TIFF, AVIF...) is opened by Pillow, which reads its header (``DECODES`` counts those).

``COUNTER`` counts images sized, header bytes read and fallbacks through Pillow, for the tests
and ``scripts/bench_vision_plan.py``: a PNG costs 32 bytes, a JPEG its segment headers
(typically 20-600 bytes), never its pixels.
"""

from __future__ import annotations

import io
import struct
import threading

from ..errors import PacktoolError


class Counter:
    """Images sized, header bytes read, Pillow fallbacks: a process-wide tally."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.images = self.bytes_read = self.decodes = 0

    def add(self, nbytes: int, decoded: bool = False) -> None:
        with self._lock:
            self.images += 1
            self.bytes_read += nbytes
            self.decodes += int(decoded)

    def snapshot(self) -> dict:
        return {"images": self.images, "bytes_read": self.bytes_read, "decodes": self.decodes}


COUNTER = Counter()
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_NO_LENGTH = {0x01, *range(0xD0, 0xD9)}  # TEM, RSTn, SOI: markers without a length


class BadImage(PacktoolError):
    """Not an image, or one whose header is cut short or inconsistent."""


class _Reader:
    """Bytes at an offset of a buffer or a seekable binary file, counted."""

    def __init__(self, src):
        self.src, self.read = src, 0

    def at(self, offset: int, n: int, short: bool = False) -> bytes:
        """``n`` bytes at ``offset``; fewer only where ``short`` allows (else BadImage)."""
        if isinstance(self.src, (bytes, bytearray, memoryview)):
            got = bytes(self.src[offset:offset + n])
        else:
            self.src.seek(offset)
            got = self.src.read(n)
        self.read += len(got)
        if len(got) < n and not short:
            raise BadImage(f"the header ends at byte {offset + len(got):,} (truncated file)")
        return got


def _png(r: _Reader, head: bytes):
    if head[12:16] != b"IHDR":
        raise BadImage("a PNG whose first chunk is not IHDR")
    return struct.unpack(">II", head[16:24])


def _gif(r: _Reader, head: bytes):
    return struct.unpack("<HH", head[6:10])


def _bmp(r: _Reader, head: bytes):
    size = struct.unpack("<I", head[14:18])[0]
    if size == 12:
        return struct.unpack("<HH", head[18:22])
    w, h = struct.unpack("<ii", head[18:26])
    return w, abs(h)


def _webp(r: _Reader, head: bytes):
    kind = head[12:16]
    if kind == b"VP8 ":
        b = r.at(20, 10)
        if b[3:6] != b"\x9d\x01\x2a":
            raise BadImage("a WebP VP8 chunk without a key frame start code")
        w, h = struct.unpack("<HH", b[6:10])
        return w & 0x3FFF, h & 0x3FFF
    if kind == b"VP8L":
        b = r.at(20, 5)
        if b[0] != 0x2F:
            raise BadImage("a WebP VP8L chunk without its signature")
        bits = int.from_bytes(b[1:5], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8X":
        b = r.at(24, 6)
        return int.from_bytes(b[0:3], "little") + 1, int.from_bytes(b[3:6], "little") + 1
    raise BadImage(f"a WebP file whose first chunk is {kind!r}")


def _jpeg(r: _Reader, head: bytes):
    at = 2
    while True:
        b = r.at(at, 2)
        if b[0] != 0xFF:
            raise BadImage(f"a JPEG segment at byte {at:,} does not start with 0xFF")
        marker = b[1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _NO_LENGTH:
            at += 2
            continue
        if marker in (0xD9, 0xDA):
            raise BadImage("a JPEG with no frame header (SOF) before its image data")
        length = struct.unpack(">H", r.at(at + 2, 2))[0]
        if marker in _SOF:
            h, w = struct.unpack(">HH", r.at(at + 5, 4))
            return w, h
        if length < 2:
            raise BadImage(f"a JPEG segment at byte {at:,} of length {length}")
        at += 2 + length


_FORMATS = (  # (magic at the start, format, parser)
    (b"\x89PNG\r\n\x1a\n", "PNG", _png),
    (b"\xff\xd8", "JPEG", _jpeg),
    (b"GIF87a", "GIF", _gif),
    (b"GIF89a", "GIF", _gif),
    (b"BM", "BMP", _bmp),
)


def _detect(head: bytes):
    """(format, parser) of a file starting with ``head``, or None."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP", _webp
    return next(((fmt, parse) for magic, fmt, parse in _FORMATS if head.startswith(magic)),
                None)


def _parse(r: _Reader) -> tuple[int, int, str] | None:
    head = r.at(0, 32, short=True)
    found = _detect(head)
    if found is None:
        return None
    fmt, parse = found
    if len(head) < 26 and fmt != "JPEG":
        raise BadImage(f"a {fmt} file of {len(head)} bytes, shorter than its header")
    w, h = parse(r, head)
    if w < 1 or h < 1:
        raise BadImage(f"a {fmt} header that says {w}x{h} pixels")
    return int(w), int(h), fmt


def _pillow(src) -> tuple[int, int, str]:
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise BadImage("not a PNG, JPEG, GIF, WebP or BMP file (other formats are sized "
                       "by Pillow: pip install pillow)") from None
    f = io.BytesIO(bytes(src)) if isinstance(src, (bytes, bytearray, memoryview)) else src
    f.seek(0)
    try:
        with Image.open(f) as im:
            return int(im.size[0]), int(im.size[1]), str(im.format)
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise BadImage(f"not an image Pillow can read ({type(e).__name__}: {e})") from None


def image_size(src) -> tuple[int, int, str]:
    """``(width, height, format)`` of an image: ``src`` is its bytes, a seekable binary file
    or a path. Read from the header alone (see the module's docstring); :class:`BadImage`
    (a :class:`PacktoolError`) names what is wrong with one that is not an image."""
    if isinstance(src, str) or hasattr(src, "__fspath__"):
        with open(src, "rb") as f:
            return image_size(f)
    r = _Reader(src)
    try:
        got = _parse(r)
    except struct.error:
        raise BadImage("a header cut short") from None
    decoded = got is None
    if decoded:
        got = _pillow(src)
    COUNTER.add(r.read, decoded=decoded)
    return got
