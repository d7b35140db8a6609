"""The keys a seal may be signed with, as verification takes them: those registered in the
database (an operator's statement), or those an auditor pins (``trusted_keys``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from affidavit.core.errors import ConfigError
from affidavit.core.seal import PUBLIC_KEY_BYTES, PublicKey, unb64

REGISTERED = "not registered in this database"
PINNED = "not one of the trusted keys"
KeyLike = PublicKey | bytes | str
_KEY_ID = re.compile(r"^[0-9a-f]{16}\Z")
_KEY_HINT = (
    "Give a raw 32-byte Ed25519 public key in standard base64 (as `affidavit keys show` prints "
    "it), or the 16-hex key id of a key recorded in the database."
)


class AcceptedKeys(dict[str, PublicKey]):
    """Key id → public key, with what a key outside them is (for the seal check's error)."""

    def __init__(self, keys: dict[str, PublicKey], *, outside: str) -> None:
        super().__init__(keys)
        self.outside = outside


def accepted_keys(
    trusted: Iterable[Any] | None,
    recorded: list[PublicKey],
    *,
    key_map: Callable[[Iterable[Any]], dict[str, PublicKey]],
    pinned: Callable[[Iterable[Any], list[PublicKey]], dict[str, PublicKey]],
) -> AcceptedKeys:
    """The registered keys, or with ``trusted`` the pinned ones only."""
    if trusted is None:
        return AcceptedKeys(key_map(recorded), outside=REGISTERED)
    return AcceptedKeys(pinned(trusted, recorded), outside=PINNED)


def unknown_key_error(keys: dict[str, PublicKey], key_id: str) -> str:
    outside = keys.outside if isinstance(keys, AcceptedKeys) else ""
    return f"the seal is signed by unknown key {key_id}" + (f" ({outside})" if outside else "")


def key_map(keys: Iterable[Any]) -> dict[str, PublicKey]:
    found: dict[str, PublicKey] = {}
    for item in keys:
        key = public_key(item)
        found[key.key_id] = key
    return found


def public_key(item: Any) -> PublicKey:
    if isinstance(item, PublicKey):
        return item
    if isinstance(item, tuple) and len(item) == 2:  # (key_id, raw) from a mapping
        return public_key(item[1])
    if isinstance(item, str):
        try:
            item = unb64(item.strip())
        except ValueError as exc:
            raise ConfigError(f"public key {item!r} is {exc}", hint=_KEY_HINT) from None
    if isinstance(item, bytes | bytearray):
        if len(item) != PUBLIC_KEY_BYTES:
            raise ConfigError(
                f"a public key is {PUBLIC_KEY_BYTES} bytes, not {len(item)}", hint=_KEY_HINT
            )
        return PublicKey.from_raw(bytes(item))
    raise ConfigError(f"not a public key: {type(item).__name__}", hint=_KEY_HINT)


def pinned_keys(trusted: Iterable[KeyLike], recorded: list[PublicKey]) -> dict[str, PublicKey]:
    by_id = {k.key_id: k for k in recorded}
    found: dict[str, PublicKey] = {}
    for item in trusted:
        if isinstance(item, str) and _KEY_ID.match(item):
            if item not in by_id:
                raise ConfigError(
                    f"trusted key id {item} is not recorded in the database",
                    hint="Pass the public key itself (base64) instead of its id.",
                )
            found[item] = by_id[item]
        else:
            key = public_key(item)
            found[key.key_id] = key
    return found
