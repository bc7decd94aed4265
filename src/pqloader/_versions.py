"""What tells one version of a remote object from the next, and when that is not enough to
cache it.

An HTTP server's version of a file is often its modification time to the second: nginx's
ETag is that time and the size, Python's ``http.server`` sends a Last-Modified alone. A file
rewritten at the same size within the second of the last change keeps its version, and the
cache would serve the old bytes for the new file for good (and to every later job). So an
object whose Last-Modified is within :data:`RACY_S` of when it was listed, and whose ETag
(if any) is no digest of its content, is read but not cached: the rule git applies to files
modified as it indexes them ("racily clean"). Once that second is past, a rewrite gets a new
version, so a later opening caches the object.
"""

from __future__ import annotations

import re
import time
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Any

# A Last-Modified this recent (the second it is rounded down to, and 2 s for a server's clock
# behind this machine's; one further behind makes a new object look older: cached, as before)
# may still be that of the next rewrite. (fsspec's info has no Date header to compare with.)
RACY_S = 3.0
_RACY = ";racy"
# An ETag that is a digest of the content (S3's MD5, also of a multipart upload): 32 hex digits
# at least; nginx's is the mtime and the size in hex ("5f8a1b2c-1a2b"), Caddy's in base 36.
_DIGEST = re.compile(r'(W/)?"?[0-9a-fA-F]{32,}')

# Best first: S3's ETag, GCS's generation, Azure's etag, fsspec HTTP's headers (ETag,
# Content-MD5, Digest, Last-Modified), mtimes.
_KEYS = ("ETag", "etag", "generation", "version_id", "VersionId", "md5Hash", "Content-MD5",
         "Digest", "mtime", "LastModified", "last_modified", "Last-Modified", "created")


def version_of(info: dict[str, Any], size: int) -> str | None:
    """An fsspec ``info`` dict's version, with the size (an object rewritten within its
    timestamp's resolution at another size is still a new version), marked racy (never
    cached) when its Last-Modified is recent; ``None`` with no version key at all (never
    cached either)."""
    for key in _KEYS:
        value = info.get(key)
        if value not in (None, ""):
            version = f"{key}={value};size={size}"
            timed = key == "Last-Modified" or (key in ("ETag", "etag") and not _DIGEST.match(
                str(value)))  # (an ETag that hashes the content changes with it)
            return version + _RACY if timed and _recent(info.get("Last-Modified")) else version
    return None


def _recent(last_modified: Any) -> bool:
    if not isinstance(last_modified, str):
        return False
    try:
        when = parsedate_to_datetime(last_modified)
    except (TypeError, ValueError, IndexError, OverflowError):
        return False  # (a date that does not parse: the version is the ETag's alone)
    if when.tzinfo is None:  # asctime's format names no zone: HTTP dates are all in GMT (a
        when = when.replace(tzinfo=timezone.utc)  # naive one was read as local time: found
        # in review, 9 h old in Tokyo, so cached)
    return when.timestamp() > time.time() - RACY_S


def cacheable(version: str | None) -> bool:
    """Whether bytes of this version may be cached (and read from the cache)."""
    return version is not None and not version.endswith(_RACY)


def same_version(a: str | None, b: str | None) -> bool:
    """Whether two versions are of the same object (one may have been racy, not the other)."""
    return (a or "").removesuffix(_RACY) == (b or "").removesuffix(_RACY) and \
        (a is None) == (b is None)
