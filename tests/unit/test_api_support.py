"""Fixtures for the API tests: a real database (SQLite and, when configured, PostgreSQL), the app
behind a TestClient, tokens of several projects, and rows a worker would write.

Test modules import these with `from test_api_support import *`. The PostgreSQL database is
created once per test session under a unique name, migrated once, emptied (TRUNCATE) before each
test and dropped at the end; SQLite tests copy a migrated template file.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from jobcore.db import migrate
from jobcore.db.models import Base, Checkpoint, Job, JobEvent, JobMetric, utcnow
from jobcore.settings import Settings
from server.app import create_app
from server.auth.cache import cache_for
from server.auth.service import create_token, set_project_limits
from server.inference import plans
from server.progress.stream import StreamTiming

__all__ = [
    "BOOTSTRAP",
    "RESPONSE_SENT",
    "Api",
    "api",
    "api_db_url",
    "api_pg_database",
    "api_sqlite_template",
    "spec_body",
]

BOOTSTRAP = "bootstrap-test-token"
RESPONSE_SENT = "-- the response was sent --"
PG_ENV = "TWINKLE_TEST_POSTGRES_URL"


def spec_body(**overrides: Any) -> dict[str, Any]:
    """A minimal valid job body: a hub model id and a hub dataset id (never downloaded here)."""
    body: dict[str, Any] = {
        "name": "demo",
        "spec": {
            "model": {"model_id": "org/tiny-llama"},
            "data": {"train_file": "hf://datasets/org/tiny-data"},
        },
    }
    body.update(overrides)
    return body


# Test modules star-import these fixtures, so pytest holds one copy of each per module; the
# migrated SQLite template and the PostgreSQL database are shared through these module globals,
# and the database is dropped when the last module using it is done.
_shared: dict[str, Any] = {"template": None, "pg_url": None, "pg_users": 0}


@pytest.fixture(scope="session")
def api_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if _shared["template"] is None:
        path = tmp_path_factory.mktemp("api-template") / "template.db"
        migrate.upgrade(f"sqlite:///{path}")
        _shared["template"] = path
    template: Path = _shared["template"]
    return template


@pytest.fixture(scope="session")
def api_pg_database() -> Iterator[str]:
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set (PostgreSQL API tests disabled)")
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    if _shared["pg_url"] is None:
        name = f"twinkle_api_{uuid.uuid4().hex[:12]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        created = make_url(base).set(database=name).render_as_string(hide_password=False)
        migrate.upgrade(created)
        _shared["pg_url"] = created
    _shared["pg_users"] += 1
    url: str = _shared["pg_url"]
    try:
        yield url
    finally:
        _shared["pg_users"] -= 1
        if _shared["pg_users"] == 0:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
            _shared["pg_url"] = None
        admin.dispose()


def _truncate_all(url: str) -> None:
    engine = create_engine(url)
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def api_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("api_sqlite_template")
        target = tmp_path / "api.db"
        shutil.copyfile(template, target)
        return f"sqlite:///{target}"
    url: str = request.getfixturevalue("api_pg_database")
    _truncate_all(url)
    return url


@dataclass
class Api:
    """The running app and helpers to act as users and as a worker."""

    app: FastAPI
    client: TestClient
    settings: Settings
    dispatched: list[str] = field(default_factory=list)

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {BOOTSTRAP}"}

    def session(self) -> Session:
        factory: sessionmaker[Session] = self.app.state.session_factory
        return factory()

    @contextmanager
    def response_ends(self, into: list[str]) -> Iterator[None]:
        """Append `RESPONSE_SENT` to `into` when the app has sent the last byte of a response (the
        app as the test client calls it, under every middleware)."""
        transport: Any = self.client._transport
        app = transport.app

        async def marked(scope: Any, receive: Any, send: Any) -> None:
            async def send_marked(message: Any) -> None:
                await send(message)
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    into.append(RESPONSE_SENT)

            await app(scope, receive, send_marked)

        transport.app = marked
        try:
            yield
        finally:
            transport.app = app

    def token(
        self, project: str = "default", scopes: tuple[str, ...] = ("read", "write"), **kw: Any
    ) -> dict[str, str]:
        with self.session() as session, session.begin():
            plain, _ = create_token(session, project, scopes, name="test", **kw)
        return {"Authorization": f"Bearer {plain}"}

    def limit_project(self, project: str, **limits: int | None) -> None:
        with self.session() as session, session.begin():
            set_project_limits(
                session,
                project,
                max_running_jobs=limits.get("max_running_jobs"),
                max_queued_jobs=limits.get("max_queued_jobs"),
            )

    def submit(self, headers: dict[str, str] | None = None, **overrides: Any) -> dict[str, Any]:
        response = self.client.post("/v1/jobs", json=spec_body(**overrides), headers=headers or self.admin)
        assert response.status_code == 201, response.text
        return response.json()

    def force_status(self, job_id: str, status: str, **values: Any) -> None:
        """Put a job in a state as the worker would have (bypassing the API on purpose)."""
        with self.session() as session, session.begin():
            job = session.get(Job, job_id)
            assert job is not None
            job.status = status
            for key, value in values.items():
                setattr(job, key, value)

    def add_event(
        self,
        job_id: str,
        message: str,
        type_: str = "message",
        level: str = "info",
        data: dict[str, Any] | None = None,
    ) -> int:
        with self.session() as session, session.begin():
            event = JobEvent(job_id=job_id, message=message, type=type_, level=level, data=data)
            session.add(event)
            session.flush()
            return event.id

    def add_metrics(self, job_id: str, name: str, values: list[float], seconds_per_step: float = 1.0) -> None:
        start = utcnow() - timedelta(seconds=seconds_per_step * len(values))
        with self.session() as session, session.begin():
            for i, value in enumerate(values, start=1):
                created = start + timedelta(seconds=seconds_per_step * i)
                session.add(JobMetric(job_id=job_id, name=name, step=i, value=value, created_at=created))

    def add_checkpoint(
        self, job_id: str, step: int, *, is_best: bool = False, files: int = 2
    ) -> dict[str, Any]:
        """A complete checkpoint directory inside the job dir, and its row."""
        directory = self.settings.jobs_dir / job_id / "checkpoints" / f"step-{step}"
        directory.mkdir(parents=True, exist_ok=True)
        for i in range(files):
            (directory / f"shard-{i}.bin").write_bytes(bytes([step % 256, i]) * 4096)
        (directory / "COMPLETE").write_text("ok")
        size = sum(p.stat().st_size for p in directory.iterdir())
        with self.session() as session, session.begin():
            ckpt = Checkpoint(
                job_id=job_id,
                step=step,
                path=str(directory),
                metrics={"loss": 1.0 / step},
                size_bytes=size,
                is_best=is_best,
            )
            session.add(ckpt)
            session.flush()
            return {"id": ckpt.id, "path": str(directory), "size": size}


@pytest.fixture()
def api(api_db_url: str, tmp_path: Path) -> Iterator[Api]:
    data_dir = tmp_path / "data"
    roots = tmp_path / "roots"
    roots.mkdir()
    settings = Settings(
        data_dir=data_dir,
        database_url=api_db_url,
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        bootstrap_token=BOOTSTRAP,
        allowed_roots=f"{data_dir}:{roots}",
        max_upload_bytes=256 * 1024,
    )
    dispatched: list[str] = []
    app = create_app(settings, dispatch=dispatched.append)
    app.state.stream_timing = StreamTiming(poll_seconds=0.02, keepalive_seconds=0.1)
    # The caches' clocks stand still unless a test moves them: on a slow machine an entry must
    # not expire, or be reloaded after a response (server/common/ttl_cache.py), in the middle of
    # a test that counts statements.
    engine = app.state.engine
    still = time.monotonic()
    for cache in (cache_for(engine), plans.model_cache(engine), plans.host_cache(engine)):
        cache.clock = lambda: still
    with TestClient(app) as client:
        yield Api(app=app, client=client, settings=settings, dispatched=dispatched)
