"""The admin API: projects and tokens, their secrets shown once, and who administers what.

Tenancy: an admin token of the operator project ("default", the bootstrap token's) administers
every project; an admin token of another project administers that project only (others are 404),
and may not create projects or set quotas or the Slurm account (403); tokens without the admin
scope get 403.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from test_api_support import *  # noqa: F403
from test_api_support import Api

from jobcore.db.models import Project


def create_project(api: Api, name: str, **fields: Any) -> dict[str, Any]:
    response = api.client.post("/v1/projects", json={"name": name, **fields}, headers=api.admin)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def project_admin(api: Api, project: str) -> dict[str, str]:
    response = api.client.post(
        "/v1/tokens", json={"project": project, "scopes": ["admin"], "name": "owner"}, headers=api.admin
    )
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['token']}"}


def stored_secret(api: Api, project_id: str) -> str:
    with api.session() as session:
        project = session.get(Project, project_id)
        assert project is not None
        return project.webhook_secret


def test_the_webhook_secret_is_shown_at_creation_and_rotation_only(api: Api) -> None:
    created = create_project(api, "team-a", max_queued_jobs=5, webhook_url="https://hooks.example/a")
    assert created["object"] == "project" and created["name"] == "team-a"
    assert created["max_queued_jobs"] == 5 and created["max_running_jobs"] is None
    secret = created["webhook_secret"]
    assert secret.startswith("whsec_") and secret == stored_secret(api, created["id"])

    for path in (f"/v1/projects/{created['id']}", "/v1/projects/team-a"):  # by id or by name
        read = api.client.get(path, headers=api.admin)
        assert read.status_code == 200 and "webhook_secret" not in read.json()
        assert secret not in read.text
    listed = api.client.get("/v1/projects", headers=api.admin)
    assert {p["name"] for p in listed.json()["data"]} >= {"default", "team-a"}
    assert secret not in listed.text

    rotated = api.client.post(f"/v1/projects/{created['id']}/rotate-webhook-secret", headers=api.admin)
    assert rotated.status_code == 200
    new_secret = rotated.json()["webhook_secret"]
    assert new_secret != secret and new_secret == stored_secret(api, created["id"])


def test_quotas_and_the_default_webhook_are_set_through_the_api(api: Api) -> None:
    project = create_project(api, "quota")
    writer = api.token("quota")
    patched = api.client.patch(
        "/v1/projects/quota",
        json={"max_queued_jobs": 1, "webhook_url": "https://hooks.example/q"},
        headers=api.admin,
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["max_queued_jobs"] == 1 and patched.json()["max_running_jobs"] is None
    first = api.submit(writer)
    assert first["webhook_url"] == "https://hooks.example/q"  # the project's default, copied on
    refused = api.client.post("/v1/jobs", json=spec_body(), headers=writer)  # noqa: F405
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "project_queue_limit"

    # null clears a field; fields not sent stay as they were
    cleared = api.client.patch(
        f"/v1/projects/{project['id']}", json={"max_queued_jobs": None}, headers=api.admin
    )
    assert (
        cleared.json()["max_queued_jobs"] is None
        and cleared.json()["webhook_url"] == "https://hooks.example/q"
    )
    own = api.submit(writer, webhook_url="https://elsewhere.example/hook")
    assert own["webhook_url"] == "https://elsewhere.example/hook"


def test_tokens_are_created_listed_and_revoked_through_the_api(api: Api) -> None:
    create_project(api, "ci")
    expires = (datetime.now(UTC) + timedelta(days=30)).isoformat()
    body = {
        "project": "ci",
        "name": "pipeline",
        "scopes": ["read"],
        "rate_limit_per_minute": 100,
        "expires_at": expires,
    }
    created = api.client.post("/v1/tokens", json=body, headers=api.admin)
    assert created.status_code == 201, created.text
    token = created.json()
    assert (
        token["token"].startswith("tj_")
        and token["scopes"] == ["read"]
        and token["rate_limit_per_minute"] == 100
    )
    assert token["expires_at"] is not None and token["revoked"] is False
    auth = {"Authorization": f"Bearer {token['token']}"}
    assert api.client.get("/v1/jobs", headers=auth).status_code == 200

    listed = api.client.get("/v1/tokens", params={"project": "ci"}, headers=api.admin)
    assert [t["id"] for t in listed.json()["data"]] == [token["id"]]
    assert token["token"] not in listed.text and "token_hash" not in listed.text
    assert api.client.get(f"/v1/tokens/{token['id']}", headers=api.admin).json()["name"] == "pipeline"

    revoked = api.client.post(f"/v1/tokens/{token['id']}/revoke", headers=api.admin)
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    assert api.client.get("/v1/jobs", headers=auth).status_code == 401  # at once, in this process
    again = api.client.post(f"/v1/tokens/{token['id']}/revoke", headers=api.admin)
    assert again.status_code == 200  # idempotent


def test_an_expired_token_is_refused(api: Api) -> None:
    expires = (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat()
    created = api.client.post("/v1/tokens", json={"expires_at": expires}, headers=api.admin)
    auth = {"Authorization": f"Bearer {created.json()['token']}"}
    assert api.client.get("/v1/jobs", headers=auth).status_code == 200  # now cached for 5 s
    time.sleep(1.6)
    assert api.client.get("/v1/jobs", headers=auth).status_code == 401  # the cache knows the expiry too


def test_a_project_admin_administers_its_own_project_only(api: Api) -> None:
    mine = create_project(api, "mine")
    theirs = create_project(api, "theirs")
    admin = project_admin(api, "mine")
    their_token = api.client.post("/v1/tokens", json={"project": "theirs"}, headers=api.admin).json()

    listed = api.client.get("/v1/projects", headers=admin).json()["data"]
    assert [p["id"] for p in listed] == [mine["id"]]
    assert api.client.get("/v1/projects/mine", headers=admin).status_code == 200
    # what it may do in its own project
    hook = api.client.patch(
        "/v1/projects/mine", json={"webhook_url": "https://hooks.example/m"}, headers=admin
    )
    assert hook.status_code == 200
    assert api.client.post("/v1/projects/mine/rotate-webhook-secret", headers=admin).status_code == 200
    made = api.client.post("/v1/tokens", json={"name": "bot"}, headers=admin)  # default: its own project
    assert made.status_code == 201 and made.json()["project_id"] == mine["id"]
    own_tokens = api.client.get("/v1/tokens", headers=admin).json()["data"]
    assert {t["project_id"] for t in own_tokens} == {mine["id"]}

    # another project's objects do not exist for it
    not_found = [
        api.client.get(f"/v1/projects/{theirs['id']}", headers=admin),
        api.client.get("/v1/projects/theirs", headers=admin),
        api.client.patch("/v1/projects/theirs", json={"webhook_url": None}, headers=admin),
        api.client.post("/v1/projects/theirs/rotate-webhook-secret", headers=admin),
        api.client.get(f"/v1/tokens/{their_token['id']}", headers=admin),
        api.client.post(f"/v1/tokens/{their_token['id']}/revoke", headers=admin),
        api.client.get("/v1/tokens", params={"project": "theirs"}, headers=admin),
        api.client.post("/v1/tokens", json={"project": "theirs"}, headers=admin),
    ]
    for response in not_found:
        assert response.status_code == 404, response.text
        assert response.json()["error"]["type"] == "not_found_error"
    assert not_found[-1].json()["error"]["param"] == "project"
    assert stored_secret(api, theirs["id"]) == theirs["webhook_secret"]  # untouched

    # operator-only operations
    new = api.client.post("/v1/projects", json={"name": "grab"}, headers=admin)
    assert new.status_code == 403 and new.json()["error"]["code"] == "operator_only"
    quota = api.client.patch("/v1/projects/mine", json={"max_running_jobs": 100}, headers=admin)
    assert quota.status_code == 403 and quota.json()["error"]["param"] == "max_running_jobs"


def test_the_slurm_account_is_set_by_the_operator_and_read_by_the_project(api: Api) -> None:
    created = create_project(api, "hpc", slurm_account="hpc-lab")
    assert created["slurm_account"] == "hpc-lab"
    assert create_project(api, "plain")["slurm_account"] is None  # the worker's default account
    admin = project_admin(api, "hpc")
    assert api.client.get("/v1/projects/hpc", headers=admin).json()["slurm_account"] == "hpc-lab"

    # A project admin may not choose what the cluster charges its jobs to (another team's account).
    grab = api.client.patch("/v1/projects/hpc", json={"slurm_account": "other-team"}, headers=admin)
    assert grab.status_code == 403 and grab.json()["error"]["code"] == "operator_only", grab.text
    assert grab.json()["error"]["param"] == "slurm_account"
    hook = api.client.patch("/v1/projects/hpc", json={"webhook_url": "https://h.example/x"}, headers=admin)
    assert hook.status_code == 200 and hook.json()["slurm_account"] == "hpc-lab"  # not sent: unchanged
    assert (
        api.client.patch("/v1/projects/plain", json={"slurm_account": "x"}, headers=admin).status_code == 404
    )

    changed = api.client.patch("/v1/projects/hpc", json={"slurm_account": "hpc_2024.gpu"}, headers=api.admin)
    assert changed.status_code == 200 and changed.json()["slurm_account"] == "hpc_2024.gpu"
    cleared = api.client.patch("/v1/projects/hpc", json={"slurm_account": None}, headers=api.admin)
    assert cleared.status_code == 200 and cleared.json()["slurm_account"] is None
    with api.session() as session:
        assert session.get_one(Project, created["id"]).slurm_account is None


def test_a_slurm_account_that_is_not_a_slurm_account_name_is_422(api: Api) -> None:
    create_project(api, "named")
    for account in ("", "has space", "-x", ".x", "a;b", "a/b", "x" * 65, "$(id)", "a,b"):
        for response in (
            api.client.post(
                "/v1/projects", json={"name": "new", "slurm_account": account}, headers=api.admin
            ),
            api.client.patch("/v1/projects/named", json={"slurm_account": account}, headers=api.admin),
        ):
            assert response.status_code == 422, (account, response.text)
            assert response.json()["error"]["param"] == "slurm_account"
    assert create_project(api, "longest", slurm_account="x" * 64)["slurm_account"] == "x" * 64


@pytest.mark.parametrize("scopes", [("read",), ("read", "write")])
def test_tokens_without_the_admin_scope_get_403(api: Api, scopes: tuple[str, ...]) -> None:
    create_project(api, "team")
    user = api.token("team", scopes)
    calls = [
        api.client.get("/v1/projects", headers=user),
        api.client.post("/v1/projects", json={"name": "x"}, headers=user),
        api.client.get("/v1/projects/team", headers=user),
        api.client.patch("/v1/projects/team", json={"webhook_url": None}, headers=user),
        api.client.post("/v1/projects/team/rotate-webhook-secret", headers=user),
        api.client.get("/v1/tokens", headers=user),
        api.client.post("/v1/tokens", json={}, headers=user),
        api.client.post("/v1/tokens/tok-x/revoke", headers=user),
    ]
    for response in calls:
        assert response.status_code == 403, response.text
        assert response.json()["error"]["code"] == "insufficient_scope"
    assert api.client.get("/v1/projects").status_code == 401


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/projects", {"name": "has space"}, "name"),
        ("/v1/projects", {"name": ""}, "name"),
        ("/v1/projects", {"name": "ok", "max_queued_jobs": -1}, "max_queued_jobs"),
        ("/v1/projects", {"name": "ok", "webhook_url": "ftp://x"}, "webhook_url"),
        ("/v1/projects", {"name": "ok", "secret": "mine"}, "secret"),
        ("/v1/tokens", {"scopes": ["root"]}, "scopes.0"),
        ("/v1/tokens", {"scopes": []}, "scopes"),
        ("/v1/tokens", {"rate_limit_per_minute": 0}, "rate_limit_per_minute"),
        ("/v1/tokens", {"expires_at": "2020-01-01T00:00:00Z"}, "expires_at"),
        ("/v1/tokens", {"expires_at": "2999-01-01T00:00:00"}, "expires_at"),  # no time zone
        ("/v1/tokens", {"expires_at": "soon"}, "expires_at"),
    ],
)
def test_bad_input_is_422_naming_the_field(api: Api, path: str, body: dict[str, Any], param: str) -> None:
    response = api.client.post(path, json=body, headers=api.admin)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == param


def test_names_are_unique_and_unknown_objects_are_404(api: Api) -> None:
    create_project(api, "dup")
    again = api.client.post("/v1/projects", json={"name": "dup"}, headers=api.admin)
    assert again.status_code == 409 and again.json()["error"]["param"] == "name"
    for response in (
        api.client.get("/v1/projects/nobody", headers=api.admin),
        api.client.post("/v1/tokens/tok-missing/revoke", headers=api.admin),
    ):
        assert response.status_code == 404
    # An unknown list cursor is bad input, as in every list of the API (the fuzz test holds it).
    for path, missing in (("/v1/tokens", "tok-missing"), ("/v1/projects", "{u")):
        response = api.client.get(path, params={"after": missing}, headers=api.admin)
        assert response.status_code == 422 and response.json()["error"]["param"] == "after", response.text


def test_lists_page_with_cursors(api: Api) -> None:
    for i in range(3):
        create_project(api, f"p{i}")
    first = api.client.get("/v1/projects", params={"limit": 2}, headers=api.admin).json()
    assert first["has_more"] is True and len(first["data"]) == 2
    rest = api.client.get("/v1/projects", params={"after": first["last_id"]}, headers=api.admin).json()
    names = [p["name"] for p in first["data"] + rest["data"]]
    assert sorted(names) == ["default", "p0", "p1", "p2"] and rest["has_more"] is False
