"""API keys at rest: Fernet tokens (AES-128-CBC with an HMAC-SHA256, from the `cryptography`
package) under the keys of AUTOWEB_ENCRYPTION_KEYS.

The first key encrypts; every key decrypts (MultiFernet), so a new key is put first and the old
one stays listed until `manage.py rotate_llm_keys` has re-encrypted every stored key under the
new one. A stored value without the prefix is a key saved in plain text by an older version: it
is still read as it is, and re-encrypted by that command. Nothing here logs a key or puts one
in an exception's message.
"""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

PREFIX = "fernet:"


class KeyUnreadable(Exception):
    """A stored key that none of AUTOWEB_ENCRYPTION_KEYS decrypts (the message names no key)."""


def _fernet() -> MultiFernet:
    return MultiFernet([Fernet(key) for key in settings.AUTOWEB_ENCRYPTION_KEYS])


def is_encrypted(stored: str) -> bool:
    return stored.startswith(PREFIX)


def encrypt(plain: str) -> str:
    """The value to store for `plain`; blank stays blank (no key)."""
    if not plain:
        return ""
    return PREFIX + _fernet().encrypt(plain.encode()).decode("ascii")


def decrypt(stored: str) -> str:
    """The key a stored value holds; blank is no key."""
    if not stored:
        return ""
    if not is_encrypted(stored):
        return stored  # saved in plain text before keys were encrypted
    try:
        return _fernet().decrypt(stored[len(PREFIX) :].encode("ascii")).decode()
    except (InvalidToken, UnicodeError):
        raise KeyUnreadable(
            "a stored API key cannot be decrypted with AUTOWEB_ENCRYPTION_KEYS (was the key it "
            "was encrypted with removed from the list?)"
        ) from None


def reencrypt(stored: str) -> str:
    """The same key encrypted under the first key of AUTOWEB_ENCRYPTION_KEYS."""
    if not stored:
        return ""
    if not is_encrypted(stored):
        return encrypt(stored)
    try:
        token = _fernet().rotate(stored[len(PREFIX) :].encode("ascii"))
    except (InvalidToken, UnicodeError):
        raise KeyUnreadable(
            "a stored API key cannot be decrypted with AUTOWEB_ENCRYPTION_KEYS"
        ) from None
    return PREFIX + token.decode("ascii")
