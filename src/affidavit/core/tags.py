"""Job tags: short ``key → value`` texts a job is submitted with and listed by
(``jobs list --tag plan=gold``).

Tags are stored as plain text in their own indexed table and recorded in the job's
``job_created``: they are never encrypted, so they must not hold personal data (a customer's
name, an e-mail address); use them for what a job is (a plan tier, a region, a batch), not whom
it is about. Every input is bounded here, before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from affidavit.core.errors import ConfigError

MAX_TAGS = 16
MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 256
# a key: a letter or digit, then letters, digits and `_ . : / -` (what a label in Kubernetes or
# a cloud provider allows, so tags copied from there fit)
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*\Z")


class InvalidTags(ConfigError):
    """Tags that are not a small mapping of short texts (see :func:`check_tags`)."""

    code = "invalid_tags"
    default_hint = (
        f"Give at most {MAX_TAGS} tags, each key 1–{MAX_KEY_CHARS} characters of letters, "
        f"digits and _ . : / - (starting with a letter or digit), each value a text of at most "
        f"{MAX_VALUE_CHARS} characters without control characters. Tags are stored in plain "
        "text: never put personal data in them."
    )


def _check_text(what: str, text: object, limit: int) -> str:
    if not isinstance(text, str):
        raise InvalidTags(f"tag {what} {text!r} is not a text")
    if len(text) > limit:
        raise InvalidTags(f"tag {what} {text[:40]!r}… is {len(text)} characters, over {limit}")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) < 0xE000 for c in text):
        raise InvalidTags(f"tag {what} {text!r} holds a control character or a lone surrogate")
    return text


def check_key(key: object) -> str:
    """``key`` if it is a valid tag key.

    Raises:
        InvalidTags: it is not a text of 1–64 allowed characters.
    """
    text = _check_text("key", key, MAX_KEY_CHARS)
    if not _KEY.match(text):
        raise InvalidTags(
            f"tag key {text!r} must start with a letter or digit and hold only letters, "
            "digits and _ . : / -"
        )
    return text


def check_tags(tags: object) -> dict[str, str]:
    """``tags`` as a plain ``dict`` (``{}`` for ``None``), sorted by key, once checked.

    Raises:
        InvalidTags: not a mapping of text to text, more than :data:`MAX_TAGS` entries, or a
            key or value out of bounds (see :class:`InvalidTags`).
    """
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise InvalidTags(f"tags must be an object of key → value texts, not {type(tags).__name__}")
    if len(tags) > MAX_TAGS:
        raise InvalidTags(f"{len(tags)} tags given; at most {MAX_TAGS} are allowed")
    checked = {check_key(k): _check_text("value", v, MAX_VALUE_CHARS) for k, v in tags.items()}
    return dict(sorted(checked.items()))


def parse_tag(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (a command-line ``--tag``) as ``(key, value)``; the value may be empty
    and may hold ``=``.

    Raises:
        InvalidTags: no ``=``, or a key or value out of bounds.
    """
    key, sep, value = text.partition("=")
    if not sep:
        raise InvalidTags(f"--tag {text!r} is not KEY=VALUE", hint="Write e.g. --tag plan=gold.")
    return check_key(key), _check_text("value", value, MAX_VALUE_CHARS)


def parse_tags(texts: Iterable[str]) -> dict[str, str]:
    """Repeated ``--tag KEY=VALUE`` as checked tags (:func:`check_tags`).

    Raises:
        InvalidTags: a malformed one, a key given twice, or too many.
    """
    tags: dict[str, str] = {}
    for text in texts:
        key, value = parse_tag(text)
        if key in tags:
            raise InvalidTags(f"tag key {key!r} is given twice")
        tags[key] = value
    return check_tags(tags)


def check_tag_filter(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Tag filters (every pair must match: AND), checked as tags are, at most
    :data:`MAX_TAGS` of them.

    Raises:
        InvalidTags: a key or value out of bounds, or too many.
    """
    checked = tuple((check_key(k), _check_text("value", v, MAX_VALUE_CHARS)) for k, v in pairs)
    if len(checked) > MAX_TAGS:
        raise InvalidTags(f"{len(checked)} tag filters given; at most {MAX_TAGS} are allowed")
    return checked
