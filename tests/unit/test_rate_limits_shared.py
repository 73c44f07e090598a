"""Per-token rate limits counted in Redis are shared by every server process; without Redis each
process counts alone. Two apps (two `create_app`, as two server processes would be) on one database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from jobcore.settings import Settings
from server.app import create_app
from server.auth.ratelimit import TokenBuckets, decide
from server.auth.service import create_token

BOOTSTRAP = "rate-limit-bootstrap"
LIMIT = 3


def settings_for(tmp_path: Path, rate_limit_url: str | None) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'shared.db'}",
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        bootstrap_token=BOOTSTRAP,
        rate_limit_url=rate_limit_url,
    )


def two_servers(
    tmp_path: Path, rate_limit_url: str | None
) -> Iterator[tuple[TestClient, TestClient, dict[str, str]]]:
    with ExitStack() as stack:
        first, second = (
            stack.enter_context(TestClient(create_app(settings_for(tmp_path, rate_limit_url))))
            for _ in range(2)
        )
        factory = first.app.state.session_factory  # type: ignore[attr-defined]
        with factory() as session, session.begin():
            plain, _ = create_token(session, "busy", ["read"], "limited", rate_limit_per_minute=LIMIT)
        yield first, second, {"Authorization": f"Bearer {plain}"}


@pytest.fixture()
def shared(tmp_path: Path, redis_url: str) -> Iterator[tuple[TestClient, TestClient, dict[str, str]]]:
    yield from two_servers(tmp_path, redis_url)


@pytest.fixture()
def separate(tmp_path: Path) -> Iterator[tuple[TestClient, TestClient, dict[str, str]]]:
    yield from two_servers(tmp_path, None)


def test_two_servers_sharing_redis_allow_exactly_the_limit(
    shared: tuple[TestClient, TestClient, dict[str, str]],
) -> None:
    first, second, auth = shared
    answers = [(first if i % 2 == 0 else second).get("/v1/jobs", headers=auth) for i in range(2 * LIMIT)]
    assert [r.status_code for r in answers] == [200] * LIMIT + [429] * LIMIT
    assert [r.headers["x-ratelimit-remaining"] for r in answers[:LIMIT]] == ["2", "1", "0"]
    refused = answers[LIMIT]
    assert refused.json()["error"]["code"] == "rate_limited"
    assert (
        refused.headers["x-ratelimit-limit"] == str(LIMIT) and refused.headers["x-ratelimit-remaining"] == "0"
    )
    # one request every 20 s refills: the next is due in (almost) 20 s, the whole limit in 60 s
    assert 15 <= int(refused.headers["retry-after"]) <= 20
    assert 55 <= int(refused.headers["x-ratelimit-reset"]) <= 60


def test_without_redis_each_server_counts_alone(
    separate: tuple[TestClient, TestClient, dict[str, str]],
) -> None:
    first, second, auth = separate
    assert first.app.state.rate_limits.__class__ is TokenBuckets  # type: ignore[attr-defined]
    codes = [first.get("/v1/jobs", headers=auth).status_code for _ in range(LIMIT + 1)]
    assert codes == [200] * LIMIT + [429]
    assert [second.get("/v1/jobs", headers=auth).status_code for _ in range(LIMIT + 1)] == codes
    unlimited = {"Authorization": f"Bearer {BOOTSTRAP}"}
    assert "x-ratelimit-limit" not in first.get("/v1/jobs", headers=unlimited).headers


def test_an_unreachable_redis_falls_back_to_counting_in_process(tmp_path: Path) -> None:
    for first, _, auth in two_servers(tmp_path, "redis://127.0.0.1:1/0"):
        codes = [first.get("/v1/jobs", headers=auth).status_code for _ in range(LIMIT + 1)]
        assert codes == [200] * LIMIT + [429]


def test_where_limits_are_counted_follows_the_settings(tmp_path: Path) -> None:
    redis = "redis://cache:6379/0"
    assert Settings(data_dir=tmp_path, broker_url=redis).resolved_rate_limit_url == redis
    assert (
        Settings(data_dir=tmp_path, broker_url=redis, rate_limit_url="memory").resolved_rate_limit_url is None
    )
    assert Settings(data_dir=tmp_path, rate_limit_url="redis://other:6379/2").resolved_rate_limit_url == (
        "redis://other:6379/2"
    )
    assert Settings(data_dir=tmp_path).resolved_rate_limit_url is None  # the embedded SQLite broker


def test_verdicts_count_remaining_and_reset() -> None:
    now = [0.0]
    buckets = TokenBuckets(clock=lambda: now[0])
    verdicts = [buckets.verdict("t", 6) for _ in range(7)]  # one every 10 s
    assert [v.remaining for v in verdicts[:6]] == [5, 4, 3, 2, 1, 0]
    assert verdicts[0].reset_seconds == 10 and verdicts[5].reset_seconds == 60
    assert not verdicts[6].allowed and verdicts[6].retry_after == 10
    now[0] = 25.0  # two and a half intervals later: two requests are back
    assert buckets.verdict("t", 6).remaining == 1
    assert decide(6, 0.0, 0.0).remaining == 6
