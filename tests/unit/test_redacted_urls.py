"""A database or Redis URL that the service prints or logs never shows its password."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobcore.settings import get_settings, redacted_url
from server.auth.ratelimit import RedisRateLimiter
from twinkle_cli.main import cli

SECRET = "S3cret-Passw0rd"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            f"postgresql+psycopg://twinkle:{SECRET}@db:5432/twinkle",
            "postgresql+psycopg://twinkle:***@db:5432/twinkle",
        ),
        (f"redis://:{SECRET}@127.0.0.1:6379/5", "redis://:***@127.0.0.1:6379/5"),
        (
            f"postgresql://db/twinkle?sslmode=require&password={SECRET}&user=t",
            "postgresql://db/twinkle?sslmode=require&password=***&user=t",
        ),
        ("postgresql://twinkle@db/twinkle", "postgresql://twinkle@db/twinkle"),  # no password: as given
        ("sqlite:////var/lib/twinkle/twinkle.db", "sqlite:////var/lib/twinkle/twinkle.db"),
    ],
)
def test_the_password_reads_stars(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


@pytest.mark.filterwarnings("ignore:Query string argument")  # sqlite ignores the parameter
def test_migrate_names_the_database_without_its_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TWINKLE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TWINKLE_DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite'}?password={SECRET}")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli, ["migrate"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert "database at head: sqlite:///" in result.output and "password=***" in result.output
    assert SECRET not in result.output


def test_the_rate_limiter_logs_a_failing_redis_without_its_password(caplog: pytest.LogCaptureFixture) -> None:
    limiter = RedisRateLimiter(f"redis://:{SECRET}@127.0.0.1:1/5")  # nothing listens on port 1

    async def check() -> None:
        try:
            verdict = await limiter.check("token", 10)
            assert verdict.allowed  # counted in this process instead
        finally:
            await limiter.close()

    with caplog.at_level(logging.WARNING, logger="server.auth.ratelimit"):
        asyncio.run(check())
    assert "Redis at redis://:***@127.0.0.1:1/5 failed" in caplog.text
    assert SECRET not in caplog.text
