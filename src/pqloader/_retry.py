"""Retries that pqloader owns: which errors to retry, how long to wait, how much to send at once.

:func:`classify` sorts an exception (walking its causes, reading HTTP statuses where the client
keeps them) into throttled (503 SlowDown, 429), transient (5xx, resets, timeouts) or fatal
(403, 404, bad requests). :class:`Limiter` caps requests in flight, halving under throttling and
growing back by one per window of successes. :class:`RetryPolicy` holds the knobs.
:func:`remote_error` words what a request that failed, or was given up, is told as.
"""

from __future__ import annotations

import errno
import re
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from ._errors import DatasetNotFoundError, InvalidArgumentError, RemoteIOError
from ._signed import is_signed
from ._threads import thread as pqthread

__all__ = ["Limiter", "RangeIgnored", "RetryPolicy", "ShortRead", "classify", "remote_error",
           "with_timeout"]


class ShortRead(ConnectionError):
    """A ranged GET that returned fewer bytes than asked for (a connection cut short): retried."""


class RangeIgnored(Exception):
    """A ranged GET answered with more bytes than asked for: the server ignores HTTP Range
    requests (the whole object each time), so retrying cannot help."""

_THROTTLED = re.compile(r"\b(503|429)\b|SlowDown|ServerBusy|Throttl|TooManyRequests|"
                        r"Too Many Requests|RequestLimitExceeded|Reduce your request rate",
                        re.IGNORECASE)
# Errors that keep no status but name it: gcsfs's 403 is a bare OSError("Forbidden: path ...")
_FATAL = re.compile(r"\bForbidden\b|Access ?Denied|Unauthori[sz]ed|NoSuchKey|NoSuchBucket|"
                    r"InvalidAccessKeyId|SignatureDoesNotMatch", re.IGNORECASE)
# Paths and URLs in messages: "gs://b/503/x" names no status, nor does "b/slowdown-runs/x"
_PATH = re.compile(r"\S*/\S*")
# ProxyError: what gcsfs raises for a 502, keeping no status
_TRANSIENT = re.compile(r"\b(500|502|504)\b|InternalError|ServiceUnavailable|Connection "
                        r"(reset|aborted|refused|closed)|Server disconnected|timed? ?out|"
                        r"Could not connect|Cannot connect to host|Connect call failed|"
                        r"RemoteDisconnected|IncompleteRead|ClientPayloadError|"
                        r"ServerDisconnectedError|Broken pipe|ProxyError", re.IGNORECASE)


@dataclass(frozen=True)
class RetryPolicy:
    """How pqloader retries a request to remote storage (``ParquetDataset(...,
    retry=RetryPolicy(...))``): throttling (429, 503 SlowDown), resets, timeouts and short
    reads are retried with jittered exponential backoff, each retry counted in
    ``ds.io_stats()``; 403, 404 and other client errors are not.

    Attributes:
        attempts: tries in all, the first included.
        base_delay_s, max_delay_s: the backoff before retry ``k`` is uniform in
            ``[0, min(max_delay_s, base_delay_s * 2**k)]``.
        timeout_s: per request; a slower one is abandoned and retried (0: none). Over
            HTTP also each request of a listing, and a connection's wait for the server.
        list_timeout_s: per listing of a prefix (many pages of 1,000 names each).
        max_concurrency: requests in flight per process, at most.
        part_bytes: ranges larger than this are fetched in parallel parts.
        hole_bytes: ranges closer than this are fetched as one request (a row group's
            projected chunks closer than 8 KiB too: pyarrow reads across such gaps).
    """

    attempts: int = 10  # tries in all, the first included
    base_delay_s: float = 0.05  # backoff before retry k: uniform(0, min(max, base * 2**k))
    max_delay_s: float = 5.0
    timeout_s: float = 60.0  # per request; a request slower than this is retried
    list_timeout_s: float = 600.0  # per listing of a prefix: many pages of 1,000 names each
    max_concurrency: int = 32  # requests in flight per process, at most
    part_bytes: int = 8 << 20  # ranges larger than this are fetched in parallel parts
    hole_bytes: int = 64 << 10  # ranges closer than this are fetched as one

    def __post_init__(self) -> None:
        for name in ("attempts", "max_concurrency", "part_bytes"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"RetryPolicy {name} must be >= 1")
        for name in ("base_delay_s", "max_delay_s", "timeout_s", "list_timeout_s",
                     "hole_bytes"):  # a negative delay failed in time.sleep at the first retry
            value = getattr(self, name)
            if not value >= 0:  # nor nan
                raise InvalidArgumentError(f"RetryPolicy {name} must be >= 0, got {value!r} "
                                           "(0: no timeout, no delay, no hole filled)")


def classify(exc: BaseException) -> str:
    """``"throttled"``, ``"transient"`` (retry) or ``"fatal"`` (403, 404, bad request...)."""
    if isinstance(exc, ShortRead):  # by type: "120 of 503 bytes" names no status
        return "transient"
    if any(_cut_short(e) for e in chain(exc)):  # before the status: aiohttp's say 400
        return "transient"
    # The status first: fsspec's HTTP info() raises FileNotFoundError from a 503 or a 429.
    status = status_of(exc)
    if status is None and isinstance(exc, (
            FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
            InvalidArgumentError, RangeIgnored)):
        return "fatal"
    if status in (429, 503):
        return "throttled"
    if status is not None and (status >= 500 or status == 408):  # 408: Request Timeout
        return "transient"
    if status is not None and 400 <= status < 500:
        return "fatal"
    text = _PATH.sub(" ", " ".join(f"{type(e).__name__}: {e}" for e in chain(exc)))
    if _FATAL.search(text):
        return "fatal"
    if _THROTTLED.search(text):
        return "throttled"
    # at any depth: botocore and aiohttp wrap the socket's ConnectionRefusedError in their
    # own errors ("Could not connect to the endpoint URL"), and a server restarting for a
    # second failed the read at once, never retried (found in review)
    if _TRANSIENT.search(text) or any(
            isinstance(e, (ConnectionError, TimeoutError)) or
            (isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS) for e in chain(exc)):
        return "transient"
    return "fatal"


_TRANSIENT_ERRNOS = frozenset({errno.ECONNRESET, errno.ECONNREFUSED, errno.ETIMEDOUT,
                               errno.EPIPE, errno.EAGAIN, errno.EIO})


def chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what raised it, outermost first (at most 8)."""
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in seen and len(seen) < 8:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


# A body cut short: the connection closed before the Content-Length, or a chunk was lost
_CUT_SHORT = frozenset({"ClientPayloadError", "ContentLengthError", "TransferEncodingError",
                        "ContentEncodingError", "IncompleteRead"})


def _cut_short(e: BaseException) -> bool:
    return any(c.__name__ in _CUT_SHORT for c in type(e).__mro__)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status in an exception chain: aiohttp's ``status``, azure-core's
    ``status_code``, botocore's response. Not the ``code`` of aiohttp's errors parsing a
    response (``HttpProcessingError``): 400 for a body cut short, which is no reply of the
    server's."""
    for e in chain(exc):
        parsing = any(c.__name__ == "HttpProcessingError" for c in type(e).__mro__)
        status = getattr(e, "status", None) or getattr(e, "status_code", None) or \
            (None if parsing else getattr(e, "code", None))
        if isinstance(status, int) and 100 <= status < 600:
            return status
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
    return None


class Limiter:
    """Additive-increase, multiplicative-decrease cap on requests in flight."""

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.limit = max(1, min(8, maximum))
        self._in_flight = 0
        self._ok = 0
        self._cond = threading.Condition()

    def __enter__(self) -> Limiter:
        with self._cond:
            while self._in_flight >= self.limit:
                self._cond.wait()
            self._in_flight += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify()

    def succeeded(self) -> None:
        with self._cond:
            self._ok += 1
            if self._ok >= self.limit and self.limit < self.maximum:
                self.limit += 1
                self._ok = 0
                self._cond.notify()

    def throttled(self) -> None:
        with self._cond:
            self.limit = max(1, self.limit // 2)
            self._ok = 0


class Abandoned(Exception):
    """The reads' caller is gone (an error or Ctrl-C there) or the interpreter is exiting: a
    request left to run on is no longer waited for, nor retried."""


# Set as the interpreter exits, before it joins the IO pools' threads (threading's exit hooks
# run last registered first, so this one before concurrent.futures' join): a read retried
# through a stalled store kept the process from exiting for attempts x timeout (found in
# review: 20 s after Ctrl-C with a 4 x 5 s policy; ~10 minutes by default).
EXITING = threading.Event()
if hasattr(threading, "_register_atexit"):  # CPython 3.9+: what concurrent.futures uses
    threading._register_atexit(EXITING.set)


def stopped(cancel: threading.Event | None) -> bool:
    return EXITING.is_set() or (cancel is not None and cancel.is_set())


def pause(seconds: float, cancel: threading.Event | None) -> None:
    """Sleep ``seconds``, or less once :func:`stopped` (then :class:`Abandoned`)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if stopped(cancel):
            raise Abandoned("the reads' caller is gone")
        time.sleep(min(_POLL_S, left))


_POLL_S = 0.1  # how soon a request waited on notices that its caller is gone


def with_timeout(fn: Callable[[], Any], timeout_s: float,
                 cancel: threading.Event | None = None) -> Any:
    """``fn()`` on a helper thread, abandoned (and retried by the caller) after the timeout,
    or at once (:class:`Abandoned`) once :func:`stopped`."""
    if timeout_s <= 0 and cancel is None:
        return fn()
    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)

    thread = pqthread(run, "pqloader-request")
    thread.start()
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else float("inf")
    while thread.is_alive() and (left := deadline - time.monotonic()) > 0:
        if stopped(cancel):
            raise Abandoned("the reads' caller is gone")
        thread.join(min(_POLL_S, left))
    if thread.is_alive():
        raise FutureTimeout(f"no answer in {timeout_s:g} s")
    if error:
        raise error[0]
    return result[0]


def remote_error(url: str, exc: BaseException, attempts: int, kind: str) -> Exception:
    """What a request that failed (``kind``, after ``attempts``) is told as, naming ``url``."""
    status = status_of(exc)
    if status == 412:  # If-Match: another version than the dataset opened
        return RemoteIOError(
            f"{url}: the object was replaced since the dataset was opened (the server has "
            "another version: 412 Precondition Failed); open the dataset again")
    # fsspec's HTTP filesystem raises a 403 as FileNotFoundError, and a 403 mid-read as
    # aiohttp's own error: told "no such object", never that a signed URL may have expired
    # (found in review)
    unreachable = next((e for e in chain(exc) if _unreachable(e)), None)
    if unreachable is not None and kind == "fatal":  # fsspec's HTTP says FileNotFoundError
        return RemoteIOError(f"{url}: no connection was made ({type(unreachable).__name__}: "
                             f"{unreachable}); check the URL's host or the endpoint in "
                             "storage_options, and the network")
    if isinstance(exc, FileNotFoundError) and kind == "fatal" and status not in (401, 403):
        return DatasetNotFoundError(f"{url}: no such object ({exc})")
    if (isinstance(exc, PermissionError) or status in (401, 403)) and kind == "fatal":
        expired = "; a signed URL may have expired: sign it again" if is_signed(url) else ""
        # s3fs's PermissionError says "None", its cause why; fsspec's HTTP FileNotFoundError
        # says the URL again, its cause the status
        said = next((str(e) for e in chain(exc) if str(e) not in ("", "None")
                     and " " in str(e).strip()), f"HTTP {status}" if status else
                    type(exc).__name__)
        return RemoteIOError(f"{url}: access denied ({said}); check the credentials in "
                             f"storage_options{expired}")
    if kind == "fatal":
        hint = ("; pass credentials in storage_options (e.g. key=, secret=), or anon=True "
                "for a public bucket") if "Credentials" in type(exc).__name__ else ""
        return RemoteIOError(f"{url}: {type(exc).__name__}: {exc}{hint}")
    advice = ("Check the URL's host or the endpoint in storage_options, and the network: "
              "no connection was made" if any(_unreachable(e) for e in chain(exc)) else
              "Raise RetryPolicy(attempts=...) or lower the concurrency if the store is "
              "throttling")
    return RemoteIOError(f"{url}: gave up after {attempts} attempts; last error "
                         f"{type(exc).__name__}: {exc}. {advice}")


def _unreachable(exc: BaseException) -> bool:
    """A host that did not resolve or refused the connection: more attempts were the wrong
    advice for them (found in review)."""
    return isinstance(exc, (socket.gaierror, ConnectionRefusedError)) or \
        type(exc).__name__ in ("ClientConnectorDNSError", "EndpointConnectionError")
