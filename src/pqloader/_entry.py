"""One cache entry's file: a header naming the range it holds, the bytes, their checksum.

::

    b"PQC2" | header length (u32) | header (JSON: url, version, offset, length) | bytes | xxh3-64

The header is checked against the range asked for, so an entry is never served as another
(a hash collision, a file moved by hand); the checksum against the bytes, so a torn or
corrupted entry is fetched again.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import IO, Any, TypeAlias

import pyarrow as pa
import xxhash

from ._errors import CorruptFileError

Buffer: TypeAlias = bytes | memoryview | pa.Buffer

_MAGIC = b"PQC2"
_TRAILER = struct.Struct("<Q")  # xxh3-64 of the payload


class CorruptCacheEntry(CorruptFileError):
    """A cache entry that failed its checks, deleted (the loader's reads fetch it again)."""


def write(f: IO[bytes], url: str, version: str | None, offset: int, length: int,
          pieces: Sequence[Buffer]) -> int:
    """Write an entry of ``pieces`` (``length`` bytes in all) to ``f``; the bytes written."""
    header = json.dumps({"url": url, "version": version, "offset": offset,
                         "length": length}).encode()
    digest = xxhash.xxh3_64()
    f.write(_MAGIC + struct.pack("<I", len(header)) + header)
    for piece in pieces:
        digest.update(piece)
        f.write(piece)
    f.write(_TRAILER.pack(digest.intdigest()))
    return 8 + len(header) + length + _TRAILER.size


def read_header(f: IO[bytes]) -> dict[str, Any]:
    """An entry file's header (``ValueError`` or ``struct.error`` if it has none, or one
    without its fields: ``pqloader cache ls`` failed on a KeyError, found in review)."""
    head = f.read(8)
    (n,) = struct.unpack("<I", head[4:8])
    header = json.loads(f.read(n))
    if not (isinstance(header, dict) and isinstance(header.get("url"), str)
            and isinstance(header.get("version"), (str, type(None)))
            and type(header.get("offset")) is int and type(header.get("length")) is int):
        raise ValueError(f"not an entry's header: {str(header)[:80]}")
    return header


def decode(raw: pa.Buffer, url: str, version: str | None, offset: int, length: int
           ) -> pa.Buffer | None:
    """The payload of an entry (a zero-copy slice), or ``None`` if it is not the entry it
    should be."""
    if raw.size < 8 + _TRAILER.size or raw[:4].to_pybytes() != _MAGIC:
        return None
    (n,) = struct.unpack("<I", raw[4:8].to_pybytes())
    start = 8 + n
    if raw.size != start + length + _TRAILER.size:
        return None
    try:
        header = json.loads(raw[8:start].to_pybytes())
    except ValueError:
        return None
    if header != {"url": url, "version": version, "offset": offset, "length": length}:
        return None
    payload = raw.slice(start, length)
    (digest,) = _TRAILER.unpack(raw.slice(start + length).to_pybytes())
    if xxhash.xxh3_64_intdigest(payload) != digest:
        return None
    return payload
