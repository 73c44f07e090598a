"""Settings: embedded defaults with nothing set; PostgreSQL/Redis when configured."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobcore.settings import Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DATA_DIR", "DATABASE_URL", "BROKER_URL", "ALLOWED_ROOTS", "WORKER_GPUS", "BOOTSTRAP_TOKEN"):
        monkeypatch.delenv(f"TWINKLE_{name}", raising=False)


def test_embedded_defaults_live_in_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWINKLE_DATA_DIR", str(tmp_path))
    settings = Settings()
    assert settings.resolved_database_url == f"sqlite:///{tmp_path}/twinkle.db"
    assert settings.resolved_broker_url == f"sqla+sqlite:///{tmp_path}/broker.db"
    assert settings.allowed_root_paths == [tmp_path]
    assert settings.jobs_dir == tmp_path / "jobs"


def test_external_services_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TWINKLE_DATABASE_URL", "postgresql+psycopg://u@db:5432/twinkle")
    monkeypatch.setenv("TWINKLE_BROKER_URL", "redis://cache:6379/0")
    monkeypatch.setenv("TWINKLE_ALLOWED_ROOTS", f"{tmp_path}/a:{tmp_path}/b")
    monkeypatch.setenv("TWINKLE_WORKER_GPUS", "0,1")
    settings = Settings()
    assert settings.resolved_database_url.startswith("postgresql+psycopg://")
    assert settings.resolved_broker_url == "redis://cache:6379/0"
    assert settings.allowed_root_paths == [tmp_path / "a", tmp_path / "b"]
    assert settings.worker_gpus == "0,1"


def test_relative_data_dir_is_made_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TWINKLE_DATA_DIR", "rel")
    assert Settings().data_dir == tmp_path / "rel"
