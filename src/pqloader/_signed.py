"""Signed URLs (S3 and GCS presigned, Azure SAS, CloudFront): a signature is a credential that
expires, not part of the object's name.

So a signed URL's signature is left out of what names the object (:func:`unsigned`: cache keys
and the dataset's fingerprint, so that URLs signed again hit the cache and resume a saved state),
and its secret values are left out of what pqloader prints (:func:`redact`: error messages, their
tracebacks and ``pqloader inspect``, which end up in logs).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# A parameter that marks a query as a signature -> the parameters that signature consists of.
_AWS = {"x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-expires",
        "x-amz-signedheaders", "x-amz-signature", "x-amz-security-token"}
_GOOGLE = {"x-goog-algorithm", "x-goog-credential", "x-goog-date", "x-goog-expires",
           "x-goog-signedheaders", "x-goog-signature"}
_SIGNED_BY: dict[str, set[str]] = {
    "x-amz-signature": _AWS,
    "x-goog-signature": _GOOGLE,
    "signature": {"signature", "awsaccesskeyid", "googleaccessid", "expires", "policy",
                  "key-pair-id", "x-amz-security-token"},  # S3 and GCS V2, CloudFront
    "sig": {"sig", "sv", "ss", "srt", "sp", "se", "st", "spr", "sr", "si", "sdd", "skoid",
            "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "scid"},  # Azure SAS
}
_SECRETS = ("x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature",
            "x-goog-credential", "signature", "sig", "awsaccesskeyid", "googleaccessid")
_NAMES = "|".join(map(re.escape, _SECRETS))
# a value ends where a URL's query would not go on in a message: "...&sig=abc): ..." (base64
# and hex signatures hold none of these; a ":" after one was taken too: found in review)
_SECRET = re.compile(rf"([?&](?:{_NAMES})=)[^&\s'\"<>#:;,()]+", re.IGNORECASE)
# ``scheme://user:password@host``: a credential too (HTTP basic auth), printed and cached as
# part of the URL (found in review)
_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)[^/\s@?#]+@", re.IGNORECASE)


def unsigned(url: str) -> str:
    """``url`` without the parameters of its signature, if it is signed, nor a user and
    password before its host; else as it is (a local path too: ``x?sig=1.parquet`` is a
    file's name)."""
    if "://" not in url:
        return url
    return _without_signature(_USERINFO.sub(r"\1", url, count=1))


def _without_signature(url: str) -> str:
    if "?" not in url:
        return url
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    names = {k.lower() for k, _ in query}
    drop = set().union(*(params for mark, params in _SIGNED_BY.items() if mark in names))
    if not drop:
        return url
    kept = [(k, v) for k, v in query if k.lower() not in drop]
    return urlunsplit(parts._replace(query=urlencode(kept)))


def is_signed(url: str) -> bool:
    """Whether ``url`` carries a signature (that may expire)."""
    return "://" in url and _without_signature(url) != url


def has_secret(url: str) -> bool:
    """Whether ``url`` carries a signature or a password (:func:`unsigned` drops them)."""
    return unsigned(url) != url


def redact(text: str) -> str:
    """``text`` with the secret values of any signed URL in it, and any URL's user and
    password, replaced by ``REDACTED``."""
    if "@" in text:
        text = _USERINFO.sub(r"\1REDACTED@", text)
    return _SECRET.sub(r"\1REDACTED", text) if "=" in text else text
