"""The resource verifiers that ship: files, HTTP resources, SQL rows.

Each checks one kind of recorded ``state_changed`` entry against the world, read-only:

- :class:`FileVerifier` (``file``): the path's content hash (``version: "sha256:<hex>"``) or its
  size and modification time (``version: "stat:<mtime_ns>:<size>"``), as recorded by
  :func:`record_file` when the tool wrote it; operation ``delete`` means the file must be absent.
- :class:`HttpVerifier` (``http``): the resource's ``ETag`` (a conditional ``GET`` with
  ``If-None-Match``; ``304`` is a match) or a version field of its JSON body; operation
  ``delete`` means ``404``/``410``.
- :class:`SqlRowVerifier` (``sql_row``): a row's version column in a database given by URL
  (``sqlite:///...`` or ``postgresql://...``); operation ``delete`` means the row is gone.

A resource that cannot be reached is a mismatch: what cannot be confirmed is not trusted.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from affidavit.core.errors import ConfigError
from affidavit.runtime._confirm import Confirmation, ConfirmationContext
from affidavit.runtime._sdk import StateChange, ToolContext
from affidavit.store import RowReader

if TYPE_CHECKING:
    import httpx

DELETE_OPERATIONS = frozenset({"delete", "deleted", "remove", "removed"})


def _gone_is_expected(change: StateChange) -> bool:
    return change.operation.lower() in DELETE_OPERATIONS


def _same(recorded: Any, actual: Any) -> bool:
    """Versions compare by value, whether stored as numbers or strings (``3`` == ``"3"``)."""
    return recorded == actual or str(recorded) == str(actual)


# --- files ------------------------------------------------------------------------------------


def file_version(path: str | os.PathLike[str], how: str = "sha256") -> str:
    """The version string of a file as :class:`FileVerifier` compares it: ``sha256:<hex>`` of
    the content, or ``stat:<mtime_ns>:<size>`` (cheaper for large files, coarser)."""
    if how == "sha256":
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return f"sha256:{digest.hexdigest()}"
    if how == "stat":
        st = os.stat(path)
        return f"stat:{st.st_mtime_ns}:{st.st_size}"
    raise ConfigError(f"unknown file version kind {how!r}", hint="Use 'sha256' or 'stat'.")


def record_file(
    ctx: ToolContext,
    path: str | os.PathLike[str],
    operation: str = "write",
    *,
    how: str = "sha256",
    resource_type: str = "file",
) -> None:
    """Record, from inside a tool, the file it just wrote (or deleted) so that confirmation
    replay can check it later."""
    absolute = str(Path(path).resolve())
    version = None if operation.lower() in DELETE_OPERATIONS else file_version(absolute, how)
    ctx.record_state_change(resource_type, absolute, operation, version=version)


class FileVerifier:
    """Checks ``file`` resources: the resource id is the path."""

    def __init__(self, resource_type: str = "file") -> None:
        self.resource_types = (resource_type,)

    def verify(self, ctx: ConfirmationContext, change: StateChange) -> Confirmation:
        path = Path(change.resource_id)
        if _gone_is_expected(change):
            if path.exists():
                return Confirmation.mismatch(f"{path} was deleted but exists again")
            return Confirmation.match()
        if not path.is_file():
            return Confirmation.mismatch(f"{path} no longer exists")
        recorded = change.version
        if recorded is None:
            return Confirmation.match()  # only its existence was recorded
        kind = str(recorded).split(":", 1)[0]
        if kind not in ("sha256", "stat"):
            return Confirmation.mismatch(f"unrecognised file version {recorded!r}")
        actual = file_version(path, kind)
        if actual != recorded:
            what = "content" if kind == "sha256" else "size or modification time"
            return Confirmation.mismatch(
                f"{path} changed since the step wrote it ({what}: recorded {recorded}, "
                f"now {actual})",
                observed=actual,
            )
        return Confirmation.match()


# --- HTTP -------------------------------------------------------------------------------------


class HttpVerifier:
    """Checks ``http`` resources: the resource id is the URL.

    With a recorded ``etag`` it sends ``If-None-Match`` and compares the ``ETag`` it gets; with
    a recorded ``version`` it reads ``version_field`` (a dotted path) from the JSON body.
    """

    def __init__(
        self,
        *,
        resource_type: str = "http",
        version_field: str | None = "version",
        timeout: float = 5.0,
        headers: dict[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        import httpx  # imported when used: most processes never check HTTP resources

        self.resource_types = (resource_type,)
        self.version_field = version_field
        self._http_error = httpx.HTTPError
        self._client = httpx.Client(
            timeout=timeout, headers=headers or {}, transport=transport, follow_redirects=True
        )

    def close(self) -> None:
        self._client.close()

    def verify(self, ctx: ConfirmationContext, change: StateChange) -> Confirmation:
        url = change.resource_id
        request_headers = {"If-None-Match": change.etag} if change.etag else {}
        try:
            response = self._client.get(url, headers=request_headers)
        except self._http_error as exc:
            return Confirmation.mismatch(f"{url} could not be reached: {exc!r}")
        gone = response.status_code in (404, 410)
        if _gone_is_expected(change):
            if gone:
                return Confirmation.match()
            return Confirmation.mismatch(
                f"{url} was deleted but answers {response.status_code} again"
            )
        if gone:
            return Confirmation.mismatch(f"{url} is gone ({response.status_code})")
        if response.status_code == 304 and change.etag:
            return Confirmation.match()
        if not response.is_success:
            return Confirmation.mismatch(f"{url} answered {response.status_code}")
        if change.etag:
            now = response.headers.get("etag")
            if now != change.etag:
                return Confirmation.mismatch(
                    f"{url} changed: ETag recorded {change.etag}, now {now or 'none'}",
                    observed=now,
                )
            return Confirmation.match()
        if change.version is not None and self.version_field:
            try:
                value: Any = response.json()
                for part in self.version_field.split("."):
                    value = value[part]
            except (ValueError, KeyError, TypeError, IndexError):
                return Confirmation.mismatch(
                    f"{url} has no {self.version_field!r} field to compare with the recorded "
                    f"version {change.version!r}"
                )
            if not _same(change.version, value):
                return Confirmation.mismatch(
                    f"{url} changed: {self.version_field} recorded {change.version!r}, "
                    f"now {value!r}",
                    observed=value,
                )
        return Confirmation.match()


# --- SQL rows ---------------------------------------------------------------------------------


class SqlRowVerifier:
    """Checks ``sql_row`` resources: the resource id is the key of a row of ``table`` in the
    database at ``url``; the recorded ``version`` is compared with ``version_column``."""

    def __init__(
        self,
        url: str,
        *,
        table: str,
        key_column: str = "id",
        version_column: str = "version",
        resource_type: str = "sql_row",
    ) -> None:
        self.resource_types = (resource_type,)
        self.url = url
        self._rows = RowReader(url, table=table, key_column=key_column, column=version_column)

    def _read(self, key: str) -> tuple[bool, Any]:
        return self._rows.read(key)

    def verify(self, ctx: ConfirmationContext, change: StateChange) -> Confirmation:
        try:
            exists, version = self._read(change.resource_id)
        except Exception as exc:  # an unreachable database confirms nothing
            return Confirmation.mismatch(f"row {change.resource_id!r} could not be read: {exc}")
        if _gone_is_expected(change):
            if exists:
                return Confirmation.mismatch(
                    f"row {change.resource_id!r} was deleted but exists again"
                )
            return Confirmation.match()
        if not exists:
            return Confirmation.mismatch(f"row {change.resource_id!r} no longer exists")
        if change.version is not None and not _same(change.version, version):
            return Confirmation.mismatch(
                f"row {change.resource_id!r} changed: version recorded {change.version!r}, "
                f"now {version!r}",
                observed=version,
            )
        return Confirmation.match()
