"""The per-install salt secret: tenant salts nobody can compute from tenant names alone.

A tenant's ``cache_salt`` is its cache identity on a shared server. Computed from the
tenant name and the namespace only, anyone who knows both can compute it and read (by
timing) or reuse that tenant's cached prefixes. The client therefore mixes a secret into
every salt it derives: ``salt_secret=`` where given, else ``AGENTKV_SALT_SECRET``, else a
random secret created once per install at ``$AGENTKV_HOME/salt-secret`` (mode 0600).
Processes on one machine share it (so their prefixes are reused); a fleet of harness
hosts sets the same ``AGENTKV_SALT_SECRET`` everywhere to share a tenant's cache.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from pathlib import Path

from agentkv._paths import agentkv_home

__all__ = ["SECRET_ENV", "SECRET_FILE", "install_secret", "reset_install_secret"]

logger = logging.getLogger("agentkv")

SECRET_ENV = "AGENTKV_SALT_SECRET"
SECRET_FILE = "salt-secret"

_lock = threading.Lock()
_cached: tuple[str, bytes | None] | None = None  # (where it came from, the secret)


def _read_or_create(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
    text = path.read_text(encoding="ascii").strip()
    if len(text) < 32:  # a racing creator has not finished writing, or the file is damaged
        raise OSError(f"{path} holds no usable secret (delete it to make a new one)")
    return text.encode("ascii")


def install_secret() -> bytes | None:
    """The secret the client mixes into tenant salts by default.

    ``AGENTKV_SALT_SECRET`` wins; otherwise the install's secret file, created on first
    use. None, with one warning, where neither can be had (a read-only home): salts are
    then a public function of the tenant name.
    """
    global _cached
    env = os.environ.get(SECRET_ENV)
    where = f"env:{env}" if env else str(agentkv_home_path())
    cached = _cached
    if cached is not None and cached[0] == where:
        return cached[1]
    with _lock:
        if env:
            value: bytes | None = env.encode("utf-8")
        else:
            try:
                value = _read_or_create(Path(where))
            except (OSError, UnicodeDecodeError) as exc:
                logger.warning(
                    "agentkv: no salt secret (%s); tenant salts are computed from tenant "
                    "names alone, so anyone who knows a tenant's name can compute its "
                    "cache salt. Set %s or pass salt_secret=.",
                    exc,
                    SECRET_ENV,
                )
                value = None
        _cached = (where, value)
        return value


def agentkv_home_path() -> Path:
    """Where the install's secret lives (``$AGENTKV_HOME/salt-secret``)."""
    return agentkv_home() / SECRET_FILE


def reset_install_secret() -> None:
    """Forget the cached secret (tests, or after the file was replaced)."""
    global _cached
    with _lock:
        _cached = None
