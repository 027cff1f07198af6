"""The per-install salt secret: the client's tenant salts cannot be computed from names."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentkv import CacheNamespace
from agentkv.client._options import ClientOptions
from agentkv.client._state import ClientState
from agentkv.prefix import _secret
from agentkv.prefix._secret import SECRET_ENV, install_secret, reset_install_secret


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("AGENTKV_HOME", str(tmp_path))
    monkeypatch.delenv(SECRET_ENV, raising=False)
    reset_install_secret()
    yield tmp_path
    reset_install_secret()


def _client_salt(tenant: str, **options: object) -> str | None:
    return ClientState(None, ClientOptions(**options)).cache_salt(tenant)  # type: ignore[arg-type]


def test_default_salts_use_a_private_install_secret(home: Path) -> None:
    """Without salt_secret the client's salt is not the public function of the tenant
    name; the secret file is created once, mode 0600, and reused by another process."""
    salt = _client_salt("acme")
    public = CacheNamespace().cache_salt("acme")
    assert salt is not None and salt != public
    path = home / "salt-secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert salt == CacheNamespace().cache_salt("acme", secret=path.read_text().strip())
    code = (
        "from agentkv.client._options import ClientOptions;"
        "from agentkv.client._state import ClientState;"
        "print(ClientState(None, ClientOptions()).cache_salt('acme'))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "AGENTKV_HOME": str(home)},
    )
    assert other.stdout.strip() == salt  # one install, one secret: prefixes are reused


def test_the_environment_secret_wins_and_an_explicit_one_wins_over_it(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, "fleet-secret")
    assert _client_salt("acme") == CacheNamespace().cache_salt("acme", secret="fleet-secret")
    assert not (home / "salt-secret").exists()
    assert _client_salt("acme", salt_secret="mine") == CacheNamespace().cache_salt(
        "acme", secret="mine"
    )


def test_no_usable_secret_warns_once_and_salts_stay_public(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged secret file (or a read-only home): one warning that says what to set;
    salts fall back to the public derivation rather than failing the user's calls."""
    (home / "salt-secret").write_text("short\n")
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        first = install_secret()
        second = install_secret()
    assert first is None and second is None
    warned = [r for r in caplog.records if "salt secret" in r.getMessage()]
    assert len(warned) == 1 and SECRET_ENV in warned[0].getMessage()
    assert _client_salt("acme") == CacheNamespace().cache_salt("acme")


def test_a_new_home_gets_a_new_secret(
    home: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = install_secret()
    monkeypatch.setenv("AGENTKV_HOME", str(tmp_path_factory.mktemp("other-home")))
    second = install_secret()
    assert first and second and first != second
    assert _secret._cached is not None
