"""The keys a seal may be signed with, as verification takes them: those registered in the
database (an operator's statement), or those an auditor pins (``trusted_keys``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from affidavit.core.seal import PublicKey

REGISTERED = "not registered in this database"
PINNED = "not one of the trusted keys"


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
