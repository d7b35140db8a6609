"""Reading a served log over HTTP (c2sp.org/tlog-tiles), for witnesses and monitors.

Every response is streamed and dropped at a size cap (:data:`MAX_RESPONSE_BYTES`, or the
resource's own smaller bound) and a deadline: a log, or anything between it and the reader,
that answers an endless body costs a bounded amount of memory and time. Nothing read here is
trusted: the caller checks a checkpoint's signature, a proof against a root, and the entries
of a bundle against the tree (tlog/_audit.py).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from typing import Any

import httpx

from affidavit.core.errors import AffidavitError
from affidavit.core.merkle import HASH_SIZE
from affidavit.core.note import MAX_NOTE_BYTES
from affidavit.tlog._log import TILE_WIDTH, tile_path

MAX_RESPONSE_BYTES = 1 << 20  # what any one response may be (an entry bundle is the largest)
MAX_PROOF_HASHES = 128  # a consistency proof has at most 2 * 63
MAX_SMALL_ANSWER = 64 * 1024  # a consistency proof, the answer to a handed-back cosignature


class LogReadError(AffidavitError):
    """The log is unreachable or answered something unusable (an HTTP error, a body over its
    cap, a malformed tile or bundle): nothing was concluded from it."""

    code = "log_unreadable"
    default_hint = "Check --log-url and that the log is up; nothing was cosigned or recorded."


class NoProof(LogReadError):
    """The log answered a consistency request with something that is not a proof."""

    code = "no_consistency_proof"


class AnswerTooBig(LogReadError):
    """The log's answer was over the size cap of what was asked for (reading stopped there)."""


class LogClient:
    """GETs of one log's tlog-tiles resources, each capped in size and time."""

    def __init__(
        self,
        log_url: str,
        *,
        timeout: float = 10.0,
        deadline: float = 60.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.log_url = log_url.rstrip("/")
        self.deadline = deadline
        self.http = client or httpx.Client(timeout=timeout)

    def get(self, path: str, *, cap: int = MAX_RESPONSE_BYTES, **params: int) -> bytes:
        """The body of ``GET <log><path>`` (HTTP 200 only), read until ``cap`` bytes at most.

        Raises:
            LogReadError: unreachable, not 200, over ``cap`` bytes or over the deadline.
        """
        _, body = self.request("GET", path, cap=cap, params=params or None, ok_only=True)
        return body

    def request(
        self,
        method: str,
        path: str,
        *,
        cap: int,
        ok_only: bool = False,
        **kwargs: Any,
    ) -> tuple[int, bytes]:
        """``(status, body)`` of a request to ``<log><path>`` (``kwargs`` as httpx takes them),
        the body streamed and dropped past ``cap`` bytes or the deadline; with ``ok_only`` a
        status other than 200 is an error before any of the body is read.

        Raises:
            LogReadError: unreachable, (``ok_only``) not 200, over ``cap`` or the deadline.
        """
        url = self.log_url + path
        started = time.monotonic()
        try:
            with self.http.stream(method, url, **kwargs) as response:
                if ok_only and response.status_code != 200:
                    raise LogReadError(f"{method} {path}: HTTP {response.status_code} from the log")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > cap:
                    raise AnswerTooBig(_too_big(method, path, cap))
                body = bytearray()
                for chunk in response.iter_bytes():  # as it arrives: a trickle meets the deadline
                    body += chunk
                    if len(body) > cap:
                        raise AnswerTooBig(_too_big(method, path, cap))
                    if time.monotonic() - started > self.deadline:
                        raise LogReadError(
                            f"{method} {path}: the log took over {self.deadline:g} s to answer"
                        )
                return response.status_code, bytes(body)
        except httpx.HTTPError as exc:
            raise LogReadError(f"cannot read {url}: {exc}") from exc

    def checkpoint(self) -> str:
        """The latest checkpoint note (unverified)."""
        return self.get("/log/checkpoint", cap=MAX_NOTE_BYTES).decode("utf-8", "replace")

    def consistency(self, old_size: int, new_size: int) -> list[bytes]:
        """The consistency proof from ``/log/consistency`` (unverified).

        Raises:
            LogReadError: no such proof in the answer.
        """
        raw = self.get("/log/consistency", cap=MAX_SMALL_ANSWER, old=old_size, new=new_size)
        try:
            doc: Any = json.loads(raw)
            hashes = doc["proof"]
            if not isinstance(hashes, list) or len(hashes) > MAX_PROOF_HASHES:
                raise ValueError("not a list of at most 128 hashes")
            return [base64.b64decode(h, validate=True) for h in hashes]
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise NoProof(f"the log answered no consistency proof: {exc}") from exc

    def tile(self, level: int, index: int, width: int) -> list[bytes]:
        """The ``width`` hashes of hash tile ``level``/``index`` (full when width is 256).

        Raises:
            LogReadError: unreachable, or not ``width`` hashes.
        """
        path = "/log/tile/" + tile_path(level, index, None if width == TILE_WIDTH else width)
        data = self.get(path, cap=TILE_WIDTH * HASH_SIZE)
        if len(data) != width * HASH_SIZE:
            raise LogReadError(f"GET {path}: {len(data)} bytes, not {width} hashes")
        return [data[k : k + HASH_SIZE] for k in range(0, len(data), HASH_SIZE)]

    def entries(self, index: int, width: int) -> list[bytes]:
        """The ``width`` entries of entry bundle ``index`` (uint16-length-prefixed).

        Raises:
            LogReadError: unreachable, or not exactly ``width`` well-framed entries.
        """
        path = "/log/tile/" + tile_path(None, index, None if width == TILE_WIDTH else width)
        data = self.get(path)
        out: list[bytes] = []
        pos = 0
        while pos < len(data):
            if pos + 2 > len(data):
                raise LogReadError(f"GET {path}: a truncated entry length at byte {pos}")
            n = int.from_bytes(data[pos : pos + 2], "big")
            if pos + 2 + n > len(data):
                raise LogReadError(f"GET {path}: entry {len(out)} runs past the bundle")
            out.append(data[pos + 2 : pos + 2 + n])
            pos += 2 + n
        if len(out) != width:
            raise LogReadError(f"GET {path}: {len(out)} entries, not {width}")
        return out

    def close(self) -> None:
        self.http.close()


def _too_big(method: str, path: str, cap: int) -> str:
    return f"{method} {path}: the log's answer is over {cap} bytes; stopped reading"
