"""Which seal keys a database accepts: admitting a worker's key, registering the first one.

A database accepts the public keys recorded in ``signing_keys``: *active* ones (``retired_at``
NULL) may seal in a worker that starts now; *retired* ones only verify the seals they signed.
The first key that seals in an empty database is registered by
:meth:`SealKeyOps.seal_key_admit`; any other key is refused until an operator registers it
(``affidavit keys trust`` or ``keys rotate``). Mixed into
:class:`~affidavit.store._sql.SqlTransaction`; SQL uses ``?`` placeholders.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from affidavit.core.seal import ALGORITHM, PublicKey, b64
from affidavit.core.signing import SealKeyRefused, SigningKey

KEY_STATUS_SELECT = (
    "SELECT public_key, retired_at FROM signing_keys WHERE key_id = ? AND algorithm = 'ed25519'"
)
ANY_KEY_SELECT = "SELECT key_id FROM signing_keys LIMIT 1"
FIRST_KEY_INSERT = (
    "INSERT INTO signing_keys (key_id, algorithm, public_key, created_at, retired_at) "
    "VALUES (?, ?, ?, ?, NULL)"
)


@dataclass(frozen=True, slots=True)
class SealKeyAdmission:
    """What the database says of a key that would seal in it.

    ``status``: ``active`` (it may seal), ``retired`` (it verifies its old seals only),
    ``unregistered`` (not accepted), or ``mismatch`` (its key id is recorded with another
    public key). ``registered_now``: this transaction registered it, the database having had
    no key at all."""

    key_id: str
    status: str
    registered_now: bool = False

    @property
    def accepted(self) -> bool:
        """The database accepts this key's seals (an active one also makes new ones)."""
        return self.status in ("active", "retired")

    def require_active(self, key: SigningKey) -> None:
        """Raise unless this admission lets ``key`` make new seals.

        Raises:
            SealKeyRefused: the key is not registered, retired, or its id names another key.
        """
        if self.status == "active":
            return
        where = f" (from {key.path})" if key.path is not None else ""
        if self.status == "retired":
            raise SealKeyRefused(
                f"seal key {key.key_id}{where} is retired in this database: it verifies the seals "
                "it made, and makes no new ones",
                hint="Use the key file of an active key (`affidavit keys list`), or run "
                "`affidavit keys rotate` to make a new key and register it as current.",
            )
        if self.status == "mismatch":
            raise SealKeyRefused(
                f"seal key id {key.key_id}{where} is registered in this database with another "
                "public key"
            )
        public = key.public.public_key_b64
        raise SealKeyRefused(
            f"seal key {key.key_id}{where} is not registered in this database, which accepts "
            "other keys only",
            hint=f"To accept it too, an operator runs `affidavit keys trust {public}` (the "
            "registration is an operator's act: auditors still pin the keys they trust); or run "
            "`affidavit keys rotate` here to make a new key and register it as current (keys "
            "registered before stay accepted for verifying their seals). `affidavit keys list` "
            "shows the keys this database accepts.",
        )


class SealKeyOps:
    """The admission statements; relies on the transaction primitives."""

    # a statement that serializes registrations of the first key until the transaction ends,
    # for a backend whose write transactions do not already run one at a time (PostgreSQL)
    key_registry_lock: str | None = None

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def seal_key_admit(self, key: PublicKey, *, at: str) -> SealKeyAdmission:
        """Whether ``key`` may seal in this database, registering it (as added at ``at``) if
        the database has no key yet. Two transactions racing on an empty database register
        one key: the second sees the first's and refuses its own unless it is the same."""
        found = self._key_status(key)
        if found is not None:
            return found
        if self.key_registry_lock is not None:
            self.query(self.key_registry_lock)
            found = self._key_status(key)  # registered while we waited for the lock
            if found is not None:
                return found
        if self.query(ANY_KEY_SELECT):
            return SealKeyAdmission(key.key_id, "unregistered")
        self.execute(FIRST_KEY_INSERT, (key.key_id, ALGORITHM, b64(key.public_key), at))
        return SealKeyAdmission(key.key_id, "active", registered_now=True)

    def _key_status(self, key: PublicKey) -> SealKeyAdmission | None:
        rows = self.query(KEY_STATUS_SELECT, (key.key_id,))
        if not rows:
            return None
        public, retired_at = rows[0]
        if public != b64(key.public_key):
            return SealKeyAdmission(key.key_id, "mismatch")
        return SealKeyAdmission(key.key_id, "active" if retired_at is None else "retired")
