"""Reading files a user names, bounded: a path may be ``/dev/zero``, a FIFO or a multi-gigabyte
file, and a read without a bound would run until the kernel kills the process."""

from __future__ import annotations

import os
from pathlib import Path

from affidavit.core.config import MAX_INPUT_BYTES_ENV, max_input_bytes
from affidavit.core.errors import ConfigError


class InputTooLarge(ConfigError):
    """A file a user named holds more than the input limit; nothing was read past it."""

    code = "input_too_large"
    default_hint = (
        f"Raise the limit with --max-input-bytes N or ${MAX_INPUT_BYTES_ENV} if the file is "
        "meant to be that large."
    )


def read_limited(path: str | Path, what: str, *, limit: int | None = None) -> bytes:
    """The bytes of the file at ``path``, at most ``limit`` of them (default
    :func:`~affidavit.core.config.max_input_bytes`); ``what`` names the file in errors.

    Raises:
        InputTooLarge: the file holds more (at most ``limit + 1`` bytes were read).
        OSError: the file cannot be opened or read.
    """
    bound = max_input_bytes(limit)
    with open(path, "rb") as f:
        # (a read of n bytes allocates n: a regular file is read by its size, and its size
        # refuses it unread; a device or a pipe has none and is read up to the bound)
        size = os.fstat(f.fileno()).st_size
        if size > bound:
            raise InputTooLarge(f"{what} {str(path)!r} is larger than {bound:,} bytes")
        data = f.read(size + 1) if size else b""
        if len(data) > size or not size:
            data += f.read(bound + 1 - len(data))
    if len(data) > bound:
        raise InputTooLarge(f"{what} {str(path)!r} is larger than {bound:,} bytes")
    return data


def read_limited_text(path: str | Path, what: str, *, limit: int | None = None) -> str:
    """:func:`read_limited`, decoded as UTF-8.

    Raises:
        InputTooLarge: as :func:`read_limited`.
        UnicodeDecodeError: the bytes are not UTF-8.
        OSError: the file cannot be opened or read.
    """
    return read_limited(path, what, limit=limit).decode("utf-8")
