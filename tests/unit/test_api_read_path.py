"""The read path's shortcuts keep their promises: the principal cache honours revocation within
its TTL (at once when revoked through this process), reloads a token in use after a response,
never on a request's way, last_used_at is not written per request,
a page costs a fixed number of statements, rows presented without models match the documented
models, a list reads the spec only with expand=spec, reads on PostgreSQL stay on the event loop,
and a dead database connection is retried or answered 503 (never 500). On SQLite and PostgreSQL
unless marked."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text, update
from sqlalchemy.ext.asyncio import AsyncEngine
from test_api_support import *  # noqa: F403
from test_api_support import RESPONSE_SENT, Api

from jobcore.db.models import ApiToken, Checkpoint, Job, utcnow
from server.auth.cache import TTL_SECONDS, TtlCache, cache_for
from server.auth.principal import Principal
from server.auth.service import hash_token, list_tokens, revoke_token
from server.common import reads
from server.jobs.schemas import JobEventList, JobMetrics, JobOut


def _cache(api: Api) -> TtlCache[Principal]:
    engine: Engine = api.app.state.engine
    return cache_for(engine)


def _plain(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


def _revoke_elsewhere(api: Api, plain: str) -> None:
    """Revoke as another process would (the CLI): straight in the database, not via this process."""
    engine = create_engine(api.settings.resolved_database_url)
    with engine.begin() as conn:
        conn.execute(update(ApiToken).where(ApiToken.token_hash == hash_token(plain)).values(revoked=True))
    engine.dispose()


def _engines(api: Api) -> list[Engine]:
    """The app's engines: the synchronous one, and on PostgreSQL the asyncio one of the reads."""
    read_engine: AsyncEngine | None = api.app.state.read_engine
    return [api.app.state.engine] + ([read_engine.sync_engine] if read_engine is not None else [])


@contextmanager
def statements(api: Api, threads: list[str] | None = None) -> Iterator[list[str]]:
    """The SQL statements the app's engines send while the block runs (and the names of the
    threads that send them, into `threads`), those the hot reads send straight through psycopg
    (`server.common.reads.RawStatement`, no SQLAlchemy events) included."""
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        seen.append(statement)
        if threads is not None:
            threads.append(threading.current_thread().name)

    raw_fetch = reads._fetch

    async def fetch_recorded(conn: Any, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        record(conn, None, sql)
        return await raw_fetch(conn, sql, params)

    for engine in _engines(api):
        event.listen(engine, "before_cursor_execute", record)
    reads._fetch = fetch_recorded
    try:
        yield seen
    finally:
        reads._fetch = raw_fetch
        for engine in _engines(api):
            event.remove(engine, "before_cursor_execute", record)


def _token_on_a_clock(api: Api) -> tuple[dict[str, str], list[float]]:
    """A token, used once (so cached), and the clock of the cache, which the test moves."""
    headers = api.token("p1")
    now = [1000.0]
    _cache(api).clock = lambda: now[0]
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    return headers, now


def test_a_token_revoked_elsewhere_stops_working_within_the_cache_ttl(api: Api) -> None:
    headers, now = _token_on_a_clock(api)
    _revoke_elsewhere(api, _plain(headers))
    # The documented bound: this process may still accept it until the entry expires ...
    now[0] += TTL_SECONDS - 0.1
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    # ... and never after.
    now[0] += 0.2
    assert api.client.get("/v1/jobs", headers=headers).json()["error"]["code"] == "invalid_token"


def _token_reads(seen: list[str]) -> list[int]:
    return [i for i, s in enumerate(seen) if "api_tokens" in s and s.lstrip().upper().startswith("SELECT")]


def test_a_token_in_steady_use_is_reloaded_after_its_response_and_never_expires(api: Api) -> None:
    headers, now = _token_on_a_clock(api)

    def use(after_ttls: float) -> tuple[list[int], int]:
        """One read `after_ttls` TTLs later: where the token's SELECTs came among its statements,
        and where its response ended."""
        now[0] += after_ttls * TTL_SECONDS
        with statements(api) as seen, api.response_ends(seen):
            assert api.client.get("/v1/jobs", headers=headers).status_code == 200
        return _token_reads(seen), seen.index(RESPONSE_SENT)

    assert use(0.4)[0] == []  # in the first half of its life the entry is only used
    # Past it, one request reloads the token, after its whole response has gone out ...
    reads, ended = use(0.2)
    assert len(reads) == 1 and reads[0] > ended
    assert use(0)[0] == []  # ... once per half-life
    # The reloaded entry lives on past the first one's expiry: steady use never waits for the row.
    reads, ended = use(0.7)
    assert len(reads) == 1 and reads[0] > ended


def test_a_reload_that_finds_the_token_revoked_ends_it_before_the_ttl(api: Api) -> None:
    headers, now = _token_on_a_clock(api)
    _revoke_elsewhere(api, _plain(headers))
    now[0] += 0.6 * TTL_SECONDS
    # Still within the TTL, this request is served from the cache; its reload finds the token
    # revoked, and the next request is refused though the entry had time left.
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    assert api.client.get("/v1/jobs", headers=headers).json()["error"]["code"] == "invalid_token"


def test_an_entry_is_claimed_for_reload_once_per_half_life_and_never_served_expired() -> None:
    now = [0.0]
    cache: TtlCache[str] = TtlCache(ttl=10, clock=lambda: now[0])
    assert not cache.claim_refresh("k")  # nothing to reload
    cache.put("k", "v1", cache.generation)
    now[0] = 4.9
    assert not cache.claim_refresh("k")  # young: only used
    now[0] = 5.0
    assert cache.claim_refresh("k") and not cache.claim_refresh("k")  # one caller reloads
    now[0] = 7.4
    assert not cache.claim_refresh("k")
    now[0] = 7.5
    assert cache.claim_refresh("k")  # that reload never came: another may try
    assert cache.get("k") == "v1"
    now[0] = 10.0
    assert cache.get("k") is None and not cache.claim_refresh("k")  # expired: no longer served
    cache.put("k", "v2", cache.generation)
    now[0] = 14.0
    assert not cache.claim_refresh("k") and cache.get("k") == "v2"  # a put starts a new life
    cache.discard("k")
    assert cache.get("k") is None


def test_revoking_through_this_process_takes_effect_at_once(api: Api) -> None:
    headers = api.token("p1")
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    assert _cache(api).get(hash_token(_plain(headers))) is not None  # served from the cache now
    with api.session() as session, session.begin():
        revoke_token(session, next(iter(list_tokens(session, "p1"))).id)
    assert api.client.get("/v1/jobs", headers=headers).status_code == 401


def test_a_lookup_that_raced_a_revocation_is_not_cached() -> None:
    cache: TtlCache[str] = TtlCache(ttl=60)
    generation = cache.generation  # a request reads the token row ...
    cache.invalidate()  # ... a revocation commits meanwhile ...
    cache.put("hash", "stale principal", generation)  # ... and the stale row must not be kept
    assert cache.get("hash") is None
    cache.put("hash", "fresh", cache.generation)
    assert cache.get("hash") == "fresh"


def test_the_cache_is_bounded_least_recently_used_first() -> None:
    cache: TtlCache[int] = TtlCache(ttl=60, max_entries=2)
    cache.put("a", 1, cache.generation)
    cache.put("b", 2, cache.generation)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3, cache.generation)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (1, None, 3, 2)


def test_authentication_is_one_query_then_none_and_last_used_is_written_once_a_minute(api: Api) -> None:
    headers = api.token("p1")
    digest = hash_token(_plain(headers))
    with statements(api) as first:
        assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    token_reads = [s for s in first if "api_tokens" in s and s.lstrip().upper().startswith("SELECT")]
    assert len(token_reads) == 1 and "JOIN projects" in token_reads[0]
    assert sum("UPDATE api_tokens" in s for s in first) == 1  # never used before: stamped
    with statements(api) as cached:
        for _ in range(5):
            assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    assert not any("api_tokens" in s for s in cached)
    _cache(api).invalidate()  # as if the entry expired: read again, but stamped less than a minute ago
    with statements(api) as refreshed:
        assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    assert sum("api_tokens" in s for s in refreshed) == 1
    with api.session() as session, session.begin():
        stale = utcnow() - timedelta(minutes=5)
        session.execute(update(ApiToken).where(ApiToken.token_hash == digest).values(last_used_at=stale))
    _cache(api).invalidate()
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    with api.session() as session:
        used = session.query(ApiToken).filter_by(token_hash=digest).one().last_used_at
        assert used is not None and utcnow() - used < timedelta(minutes=1)


# ------------------------------------------------------------------ stale connections (PG)

# pg_terminate_backend is PostgreSQL's: these run on the PostgreSQL database only.
postgres_only = pytest.mark.parametrize(
    "api_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def _terminate_app_connections(api: Api) -> int:
    killer = create_engine(api.settings.resolved_database_url, isolation_level="AUTOCOMMIT")
    with killer.connect() as conn:
        count = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    killer.dispose()
    return int(count)


@postgres_only
def test_reads_survive_terminated_database_backends(api: Api) -> None:
    job = api.submit()
    assert api.client.get(f"/v1/jobs/{job['id']}", headers=api.admin).status_code == 200
    for path in (f"/v1/jobs/{job['id']}", "/v1/jobs"):
        assert _terminate_app_connections(api) >= 1  # the pool's idle connection dies
        response = api.client.get(path, headers=api.admin)
        assert response.status_code == 200, response.text
    _cache(api).invalidate()  # the authentication query is the first statement this time
    assert _terminate_app_connections(api) >= 1
    assert api.client.get(f"/v1/jobs/{job['id']}", headers=api.admin).json()["id"] == job["id"]


@postgres_only
def test_a_write_on_a_dead_connection_is_a_clean_503_and_the_next_one_works(api: Api) -> None:
    api.submit()
    assert _terminate_app_connections(api) >= 1
    response = api.client.post("/v1/jobs", json={"name": "x", **_body()}, headers=api.admin)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "database_unavailable"
    assert response.headers["retry-after"] == "1" and response.headers["x-request-id"]
    assert api.client.post("/v1/jobs", json={"name": "y", **_body()}, headers=api.admin).status_code == 201
    names = [j["name"] for j in api.client.get("/v1/jobs", headers=api.admin).json()["data"]]
    assert sorted(names) == ["demo", "y"]  # the refused request left nothing behind


def _body() -> dict[str, object]:
    return {
        "spec": {
            "model": {"model_id": "org/tiny-llama"},
            "data": {"train_file": "hf://datasets/org/tiny-data"},
        }
    }


# ------------------------------------------------------------- a page in a fixed number of queries


def _mixed_jobs(api: Api) -> dict[str, str]:
    """Queued jobs of several priorities, running jobs at different paces, jobs with checkpoints
    (a deleted latest one, a best one older than the latest). Returns name -> id."""
    ids = {}
    for name, priority in (("q-low", 0), ("q-high", 5), ("q-low-2", 0), ("q-mid", 2)):
        ids[name] = api.submit(name=name, priority=priority)["id"]
    for name, seconds_per_step in (("run-fast", 1.0), ("run-slow", 3.0)):
        ids[name] = api.submit(name=name)["id"]
        api.force_status(ids[name], "running", step=10, total_steps=50)
        api.add_metrics(ids[name], "loss", [1.0] * 10, seconds_per_step=seconds_per_step)
    ids["done"] = api.submit(name="done")["id"]
    api.force_status(ids["done"], "succeeded", step=40, total_steps=40)
    for step in (10, 20, 30, 40):
        api.add_checkpoint(ids["done"], step, is_best=step in (10, 20))
    with api.session() as session, session.begin():
        session.execute(
            update(Checkpoint)
            .where(Checkpoint.job_id == ids["done"], Checkpoint.step == 40)
            .values(deleted=True)
        )
    return ids


def test_a_page_reads_as_each_job_does_alone_and_as_the_unbatched_path(api: Api) -> None:
    ids = _mixed_jobs(api)
    page = api.client.get("/v1/jobs?limit=100&expand=spec", headers=api.admin).json()["data"]
    assert {j["id"] for j in page} == set(ids.values())
    for item in page:
        assert api.client.get(f"/v1/jobs/{item['id']}", headers=api.admin).json() == item
        # Presented straight from the row, yet exactly what the documented model says.
        assert JobOut.model_validate(item).model_dump(mode="json") == item
    # Without expand=spec the same page, but no spec.
    plain = api.client.get("/v1/jobs?limit=100", headers=api.admin).json()["data"]
    assert plain == [{**item, "spec": None} for item in page]
    by_name = {j["name"]: j for j in page}
    assert {n: j["queue_position"] for n, j in by_name.items() if n.startswith("q-")} == {
        "q-high": 1,
        "q-mid": 2,
        "q-low": 3,
        "q-low-2": 4,
    }
    assert by_name["run-fast"]["progress"]["eta_seconds"] == pytest.approx(40.0, rel=0.05)
    assert by_name["run-slow"]["progress"]["eta_seconds"] == pytest.approx(120.0, rel=0.05)
    done = by_name["done"]
    assert done["latest_checkpoint"]["step"] == 30 and done["best_checkpoint"]["step"] == 20
    # The name its final weights answer to, read from the spec inside the database (so a page
    # without the spec has it too); only a succeeded job has one.
    assert done["fine_tuned_model"] == f"ft:tiny-llama:done:{ids['done']}"
    assert [j["name"] for j in page if j["fine_tuned_model"]] == ["done"]
    # The per-query path (used after actions) presents the same jobs identically.
    from server.jobs import service

    with api.session() as session:
        jobs = [session.get(Job, item["id"]) for item in page]
        unbatched = service.present_jobs(session, [j for j in jobs if j is not None])
    assert [j.model_dump(mode="json") for j in unbatched] == page


def test_a_page_costs_the_same_statements_for_one_job_or_many(api: Api) -> None:
    ids = _mixed_jobs(api)
    api.client.get("/v1/jobs", headers=api.admin)  # the admin principal is cached now
    with statements(api) as one:
        assert api.client.get(f"/v1/jobs/{ids['done']}", headers=api.admin).status_code == 200
    assert len(one) == 1  # the job and its checkpoints; no BEGIN/COMMIT either (autocommit read)
    with statements(api) as small:
        assert len(api.client.get("/v1/jobs?limit=2", headers=api.admin).json()["data"]) == 2
    with statements(api) as full:
        assert len(api.client.get("/v1/jobs?limit=100", headers=api.admin).json()["data"]) == 7
    # The page, its queue places and the pace of its running jobs: three, however many of each.
    assert len(full) == 3 and len(small) <= 3


def test_the_start_up_heap_is_out_of_the_collectors_sight(api: Api) -> None:
    import gc

    # Frozen at the first start-up in this process; full collections then skip those objects.
    assert gc.get_freeze_count() > 10_000


def test_a_list_reads_the_spec_only_when_asked_and_rejects_other_expansions(api: Api) -> None:
    api.submit()
    api.client.get("/v1/jobs", headers=api.admin)  # the admin principal is cached now
    with statements(api) as plain:
        assert api.client.get("/v1/jobs", headers=api.admin).json()["data"][0]["spec"] is None
    with statements(api) as expanded:
        spec = api.client.get("/v1/jobs?expand=spec", headers=api.admin).json()["data"][0]["spec"]
    assert spec["model"]["model_id"] == "org/tiny-llama" and spec["training"]["seed"] is not None
    # Without expand=spec, a job's spec is read only to name a succeeded job's fine-tuned model.
    selected = plain[0].split("FROM jobs")[0]
    assert selected.count("jobs.spec") == 1 and re.search(
        r"CASE WHEN \(jobs\.status = .*jobs\.spec", selected
    )
    assert "jobs.spec, " in expanded[0]
    bad = api.client.get("/v1/jobs?expand=metadata", headers=api.admin)
    assert bad.status_code == 422 and bad.json()["error"]["param"].startswith("expand")


def test_event_and_metric_pages_cost_two_statements_and_keep_their_shape(api: Api) -> None:
    job = api.submit()
    for index in range(5):
        api.add_event(job["id"], f"line {index}", level="warn" if index % 2 else "info")
    api.add_metrics(job["id"], "loss", [2.0, 1.5, 1.0, 0.5])
    api.client.get("/v1/jobs", headers=api.admin)  # the admin principal is cached now
    with statements(api) as event_reads:
        events = api.client.get(f"/v1/jobs/{job['id']}/events?limit=3&level=warn", headers=api.admin).json()
    with statements(api) as metric_reads:
        metrics = api.client.get(f"/v1/jobs/{job['id']}/metrics?max_points=2", headers=api.admin).json()
    assert len(event_reads) == 2 and len(metric_reads) == 2  # the job's project check, then the page
    assert [e["message"] for e in events["data"]] == ["line 1", "line 3"] and not events["has_more"]
    assert JobEventList.model_validate(events).model_dump(mode="json") == events
    assert metrics["series"]["loss"] == [{"step": 2, "value": 1.75}, {"step": 4, "value": 0.75}]
    assert JobMetrics.model_validate(metrics).model_dump(mode="json") == metrics
    other = api.token("p2")  # another project's job is not there
    for path in ("events", "metrics"):
        response = api.client.get(f"/v1/jobs/{job['id']}/{path}", headers=other)
        assert response.status_code == 404 and response.json()["error"]["param"] == "job_id"


def test_reads_on_postgresql_run_on_the_event_loop_not_in_worker_threads(api: Api) -> None:
    job = api.submit()
    api.client.get("/v1/jobs", headers=api.admin)  # the admin principal is cached now
    threads: list[str] = []
    with statements(api, threads) as seen:
        for path in ("", f"/{job['id']}", f"/{job['id']}/events", f"/{job['id']}/metrics"):
            assert api.client.get(f"/v1/jobs{path}", headers=api.admin).status_code == 200
    assert len(seen) == len(threads) >= 4
    in_pool = [name for name in threads if name.startswith("AnyIO worker thread")]
    if api.app.state.read_engine is None:  # SQLite: the synchronous engine, one hop per read
        assert len(in_pool) == len(threads)
    else:
        assert in_pool == []


def test_metrics_downsampled_in_the_database_are_exactly_the_python_definition(api: Api) -> None:
    """The page reads each series bucketed in SQL; the buckets, steps and averages (bit for bit:
    the same floats added in the same order) are those of `downsample` over every point."""
    import random

    from jobcore.db.models import JobMetric
    from server.jobs.repository import metric_points
    from server.progress.service import downsample

    job = api.submit()
    rng = random.Random(17)
    steps = [*rng.sample(range(1, 400), 97), 398, 398]  # a step logged twice (a resume)
    with api.session() as session, session.begin():
        for step in sorted(steps):
            session.add(JobMetric(job_id=job["id"], name="loss", step=step, value=rng.uniform(0.1, 9.7)))
        for step in range(1, 8):
            session.add(JobMetric(job_id=job["id"], name="lr", step=step, value=rng.random() / 3))
    with api.session() as session:
        everything = metric_points(session, job["id"], [])
    series = {name: [(step, value) for n, step, value in everything if n == name] for name in ("loss", "lr")}
    for max_points in (2, 3, 7, 10, 33, 98, 99, 100, 500, None):
        query = "" if max_points is None else f"?max_points={max_points}"
        page = api.client.get(f"/v1/jobs/{job['id']}/metrics{query}", headers=api.admin).json()
        expected = {name: downsample(points, max_points) for name, points in series.items()}
        assert page["series"] == expected, max_points
        only_lr = api.client.get(
            f"/v1/jobs/{job['id']}/metrics?name=lr{query.replace('?', '&')}", headers=api.admin
        ).json()
        assert only_lr["series"] == {"lr": expected["lr"]}, max_points


def _recording(into: list[str], fetch: Any) -> Any:
    """`server.common.reads._fetch` that also appends each statement it runs to `into`."""

    async def fetch_recorded(conn: Any, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        into.append(sql)
        return await fetch(conn, sql, params)

    return fetch_recorded


def test_the_hot_statements_skip_sqlalchemy_on_postgresql_and_read_the_same(api: Api) -> None:
    """On the read engine every statement of the job read, the list page (with one queued job)
    and the event and metric pages runs straight on psycopg (`RawStatement`); elsewhere all run
    through Core. The output is the same either way (the other tests compare it with the ORM
    path and the models)."""
    job = api.submit()
    api.add_event(job["id"], "hello")
    api.add_metrics(job["id"], "loss", [2.0, 1.5, 1.0])
    api.client.get("/v1/jobs", headers=api.admin)  # the admin principal is cached now
    raw: list[str] = []
    history = f"/v1/jobs/{job['id']}"
    paths = ("/v1/jobs", history, f"{history}/events", f"{history}/metrics?name=loss&max_points=2")
    for path in paths:
        raw.clear()
        with statements(api) as seen:
            counted = reads._fetch  # `statements`' own recording wrapper
            reads._fetch = _recording(raw, counted)
            try:
                assert api.client.get(path, headers=api.admin).status_code == 200
            finally:
                reads._fetch = counted
        assert seen, path
        assert raw == ([] if api.app.state.read_engine is None else seen), path
