"""Tokens, scopes, rate limits and the CLI-facing token functions."""

from __future__ import annotations

import pytest
from test_api_support import *  # noqa: F403
from test_api_support import BOOTSTRAP, Api

from jobcore.db.models import ApiToken
from server.app import bootstrap
from server.auth.ratelimit import TokenBuckets
from server.auth.service import create_token, hash_token, list_tokens, revoke_token


def test_tokens_are_stored_hashed_and_shown_once(api: Api) -> None:
    with api.session() as session, session.begin():
        plain, token = create_token(session, "team-a", ["read"], name="ci")
        assert plain.startswith("tj_") and token.token_hash == hash_token(plain)
        assert plain not in {t.token_hash for t in session.query(ApiToken)}
    with api.session() as session:
        names = [(t.name, t.scopes) for t in list_tokens(session, "team-a")]
        assert names == [("ci", ["read"])]
        with pytest.raises(ValueError, match="no project"):
            list_tokens(session, "nobody")
        with pytest.raises(ValueError, match="scopes"):
            create_token(session, "team-a", ["superuser"])
        with pytest.raises(ValueError, match="no token"):
            revoke_token(session, "tok-missing")


def test_the_bootstrap_token_is_an_admin_of_default_and_registered_once(api: Api) -> None:
    bootstrap(api.settings, api.app.state.session_factory)  # a second start-up
    with api.session() as session:
        tokens = [t for t in list_tokens(session, "default") if t.token_hash == hash_token(BOOTSTRAP)]
        assert len(tokens) == 1 and tokens[0].scopes == ["admin"]


def test_read_tokens_cannot_write(api: Api) -> None:
    reader = api.token("team", ("read",))
    assert api.client.get("/v1/jobs", headers=reader).status_code == 200
    response = api.client.post("/v1/jobs", json=spec_body(), headers=reader)  # noqa: F405
    assert response.status_code == 403
    assert response.json()["error"] == {
        "type": "permission_error",
        "code": "insufficient_scope",
        "message": "this operation needs a token with the 'write' scope",
        "param": None,
    }
    job = api.submit(api.token("team"))
    for action in ("cancel", "pause", "resume", "clone"):
        assert api.client.post(f"/v1/jobs/{job['id']}/{action}", headers=reader).status_code == 403
    assert api.client.delete(f"/v1/jobs/{job['id']}", headers=reader).status_code == 403
    upload = api.client.post("/v1/files", files={"file": ("a.jsonl", b'{"text": "a"}\n')}, headers=reader)
    assert upload.status_code == 403


def test_per_token_rate_limit_is_429_with_retry_after(api: Api) -> None:
    limited = api.token("busy", rate_limit_per_minute=3)
    codes = [api.client.get("/v1/jobs", headers=limited).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    response = api.client.get("/v1/jobs", headers=limited)
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert int(response.headers["retry-after"]) >= 1
    assert api.client.get("/v1/jobs", headers=api.admin).status_code == 200  # other tokens unaffected


def test_token_buckets_refill_over_time() -> None:
    now = [0.0]
    buckets = TokenBuckets(clock=lambda: now[0])
    assert [buckets.take("t", 2) for _ in range(2)] == [None, None]
    assert buckets.take("t", 2) == 30  # 2 per minute: the next one in 30 s
    now[0] = 29.0
    assert buckets.take("t", 2) == 1
    now[0] = 31.0
    assert buckets.take("t", 2) is None
