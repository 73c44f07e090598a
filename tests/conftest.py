"""Fixtures shared by every test: hub-free tiny assets and real PostgreSQL / Redis when configured.

PostgreSQL and Redis tests run when `TWINKLE_TEST_POSTGRES_URL` / `TWINKLE_TEST_REDIS_URL` are set
(`.ci/run` sets both) and are skipped with that reason otherwise, so the suite also runs on a
machine with neither.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Shared harnesses (a live server + worker, ...) importable from every test folder.
sys.path.insert(0, str(Path(__file__).parent / "support"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama + BPE tokenizer saved with save_pretrained (built once per test session)."""
    from twinkle_core.assets import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def text_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from twinkle_core.assets import write_text_dataset

    return write_text_dataset(tmp_path_factory.mktemp("data") / "train.jsonl", n=64)


def _postgres_base_url() -> str | None:
    return os.environ.get("TWINKLE_TEST_POSTGRES_URL")


@pytest.fixture()
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    base = _postgres_base_url()
    if not base:
        pytest.skip("TWINKLE_TEST_POSTGRES_URL is not set (PostgreSQL tests disabled)")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"twinkle_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        from jobcore.db.session import get_engine

        url = make_url(base).set(database=name).render_as_string(hide_password=False)
        get_engine(url).dispose()
        get_engine.cache_clear()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture()
def redis_url() -> Iterator[str]:
    """A Redis database number of its own, flushed before and after the test."""
    base = os.environ.get("TWINKLE_TEST_REDIS_URL")
    if not base:
        pytest.skip("TWINKLE_TEST_REDIS_URL is not set (Redis tests disabled)")
    import redis

    db = 1 + (uuid.uuid4().int % 14)
    url = f"{base.rstrip('/').rsplit('/', 1)[0] if base.count('/') > 2 else base.rstrip('/')}/{db}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


# ------------------------------------------------------------------ strict mode (CI)
STRICT_ENV = "TWINKLE_TEST_STRICT"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under `TWINKLE_TEST_STRICT=1` (set by `.ci/run`) a skip fails the test, except GPU tests.

    Skips keep the suite usable on a laptop without PostgreSQL, Redis, Chromium or Ray; in CI every
    one of those is installed on purpose, so a skip there means a suite silently stopped running.
    """
    outcome = yield
    report = outcome.get_result()
    if os.environ.get(STRICT_ENV) != "1" or not report.skipped or item.get_closest_marker("gpu"):
        return
    if hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under {STRICT_ENV}=1 (CI must run every non-GPU test): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """The same for a whole module skipped at import (`pytest.importorskip` of an optional tool)."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get(STRICT_ENV) == "1" and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"module skipped under {STRICT_ENV}=1: {report.longrepr}"
