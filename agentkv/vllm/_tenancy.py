"""Tenant scope of the plugin's state: keyed MACs of (cache salt, trajectory id). Pure.

The scheduler plugin keys every trajectory by its tenant *and* its id: two tenants that
both call a trajectory ``"1"`` get two states, and an event or a query reaches a state
only when it names the same scope as the requests that created it. The scope is the
request's vLLM ``cache_salt`` (no salt: the unsalted scope), the value that already
decides which cached blocks a request may hit: whoever can name a salt can already read
that tenant's prefix cache through timing, so the salt is the tenant's capability here
too, and the server needs no tenant registry.

Keys are keyed BLAKE2b MACs under a random per-process secret: fixed size whatever the
id, and no salt is kept in the engine's memory, its logs or its answers. They do not
survive a restart, and need not: the state they key does not either.
"""

from __future__ import annotations

import hashlib
import os

__all__ = ["Scoper"]


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class Scoper:
    """Derives the book's keys from (salt, trajectory id) with a per-process secret."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else os.urandom(32)

    def tenant(self, salt: str | None) -> str:
        """The tenant key of ``salt`` (``""`` for the unsalted scope)."""
        if not salt:
            return ""
        mac = hashlib.blake2b(_utf8(salt), key=self._secret, digest_size=8, person=b"akv-tenant")
        return mac.hexdigest()

    def key(self, salt: str | None, trajectory_id: str) -> str:
        """The state key of ``trajectory_id`` in the scope of ``salt``."""
        # Unambiguous: a salt never contains NUL (vLLM refuses it, so does the route).
        message = _utf8(salt or "") + b"\x00" + _utf8(trajectory_id)
        mac = hashlib.blake2b(message, key=self._secret, digest_size=16, person=b"akv-traj")
        return mac.hexdigest()
