"""API keys, callers and roles.

A key is ``afv_<key_id>_<secret>``: ``key_id`` (16 hex) finds the row, the secret (32 random
bytes) is checked against its stored SHA-256 in constant time. The key is shown once, at
creation; only the hash is kept. Roles are ordered: ``observer`` (reads) < ``agent`` (also
submits jobs, signals waits, verifies claims) < ``admin`` (everything, in every namespace).
``approver`` reads as an observer does and also decides approvals; it submits nothing and
signals no other wait, and an ``agent`` decides no approval (only approver and admin do: see
:mod:`affidavit.core.approvals`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from affidavit.core.approvals import APPROVING_ROLES, Principal
from affidavit.core.errors import AffidavitError, ConfigError, NotFound
from affidavit.core.events import utc_now

if TYPE_CHECKING:  # (the Python client imports this module's errors without the store)
    from affidavit.store import ApiKeyRow, Store

ROLES = ("observer", "approver", "agent", "admin")
# what each role may do, by rank (approver: an observer that also decides approvals)
_RANK = {"observer": 0, "approver": 0, "agent": 1, "admin": 2}
KEY_PREFIX = "afv"
_NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_KEY = re.compile(rf"^{KEY_PREFIX}_([0-9a-f]{{16}})_([A-Za-z0-9_-]{{43}})\Z")


class Unauthorized(AffidavitError):
    code = "unauthorized"
    default_hint = "Send `Authorization: Bearer <key>` with a key from `affidavit apikeys create`."


class Forbidden(AffidavitError):
    code = "forbidden"
    default_hint = (
        "Use a key whose role allows this (observer < agent < admin; approver: an observer "
        "that decides approvals)."
    )


class ApiKeyNotFound(NotFound):
    code = "api_key_not_found"
    default_hint = "List keys with `affidavit apikeys list`."


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: the key's agent, role and namespace."""

    key_id: str
    agent_id: str
    role: str
    namespace: str

    def has(self, role: str) -> bool:
        """The caller's role is ``role`` or above (``approver``: approver or admin)."""
        if role == "approver":
            return self.role in APPROVING_ROLES
        return _RANK[self.role] >= _RANK[role]

    @property
    def principal(self) -> Principal:
        """Who this caller is when it decides: its agent id, role and key id."""
        return Principal(self.agent_id, self.role, self.key_id)

    def sees(self, namespace: str) -> bool:
        """The caller may see things of ``namespace`` (its own; an admin every one)."""
        return self.role == "admin" or namespace == self.namespace


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}", hint=f"Use one of: {', '.join(ROLES)}.")
    return role


def check_namespace(namespace: str) -> str:
    if not _NAMESPACE.match(namespace):
        raise ConfigError(
            f"invalid namespace {namespace!r}",
            hint="1–64 characters: letters, digits, '_', '.', '-', starting with a letter or "
            "digit.",
        )
    return namespace


def create_api_key(
    store: Store, *, agent_id: str, role: str, namespace: str
) -> tuple[ApiKeyRow, str]:
    """Create a key; returns the row and the key itself (shown once, never stored).

    Raises:
        ConfigError: an unknown role, an invalid namespace or an empty agent id.
    """
    check_role(role)
    check_namespace(namespace)
    if not agent_id or len(agent_id) > 128 or agent_id.strip() != agent_id:
        raise ConfigError(f"invalid agent id {agent_id!r}", hint="1–128 characters, no padding.")
    from affidavit.store import ApiKeyRow

    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    row = ApiKeyRow(key_id, agent_id, role, namespace, _hash(secret), utc_now(), None)
    with store.transaction(durable=True) as tx:
        tx.apikey_insert(row)
    return row, f"{KEY_PREFIX}_{key_id}_{secret}"


def revoke_api_key(store: Store, key_id: str) -> ApiKeyRow:
    """Revoke a key: every later request with it gets 401.

    Raises:
        ApiKeyNotFound: no such key.
    """
    with store.transaction(durable=True) as tx:
        row = tx.apikey_revoke(key_id, utc_now())
    if row is None:
        raise ApiKeyNotFound(f"no API key {key_id!r}")
    return row


def authenticate(store: Store, authorization: str | None) -> Caller:
    """The caller of an ``Authorization: Bearer <key>`` header.

    Raises:
        Unauthorized: no header, not a bearer key, an unknown, wrong or revoked key (one
            message for all, so keys cannot be probed).
    """
    if not authorization:
        raise Unauthorized("missing API key")
    scheme, _, token = authorization.partition(" ")
    match = _KEY.match(token.strip()) if scheme.lower() == "bearer" else None
    row = store.get_api_key(match.group(1)) if match else None
    if (
        match is None
        or row is None
        or not hmac.compare_digest(row.key_hash, _hash(match.group(2)))
        or row.revoked_at is not None
    ):
        raise Unauthorized("invalid or revoked API key")
    return Caller(row.key_id, row.agent_id, row.role, row.namespace)
