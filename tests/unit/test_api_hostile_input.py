"""Input crafted to break the backends (NUL characters, huge integers, odd ids) gets a 4xx, never a
500 — and every job-scoped route hides other projects' objects."""

from __future__ import annotations

import pytest
from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

HUGE = 10**30


def test_nul_characters_are_422_not_500(api: Api) -> None:
    assert api.client.post("/v1/jobs", json=spec_body(name="a\x00b"), headers=api.admin).status_code in (
        201,
        422,
    )
    for query in ("name=a%00b", "metadata=a%00:b%00", "after=job%00x"):
        response = api.client.get(f"/v1/jobs?{query}", headers=api.admin)
        assert response.status_code in (200, 422), (query, response.text)
        assert response.headers["x-request-id"]
    assert api.client.get("/v1/files?after=f%00x&purpose=a%00", headers=api.admin).status_code in (200, 422)
    assert api.client.get("/v1/jobs/job%00x", headers=api.admin).status_code in (404, 422)


def test_huge_integers_are_422_not_500(api: Api) -> None:
    job = api.submit()
    assert api.client.get(f"/v1/jobs/{job['id']}/events?after={HUGE}", headers=api.admin).status_code == 422
    stream = f"/v1/jobs/{job['id']}/events/stream"
    assert api.client.get(f"{stream}?after={HUGE}", headers=api.admin).status_code == 422
    assert api.client.get(stream, headers={**api.admin, "Last-Event-ID": str(HUGE)}).status_code == 422
    assert api.client.post("/v1/jobs", json=spec_body(priority=HUGE), headers=api.admin).status_code == 422
    assert api.client.get(f"/v1/jobs/{job['id']}/logs?rank={HUGE}", headers=api.admin).status_code == 422


JOB_ROUTES = [
    "/v1/jobs/{job}",
    "/v1/jobs/{job}/events",
    "/v1/jobs/{job}/events/stream",
    "/v1/jobs/{job}/metrics",
    "/v1/jobs/{job}/logs",
    "/v1/jobs/{job}/checkpoints",
    "/v1/jobs/{job}/checkpoints/{ckpt}/download",
]


@pytest.mark.parametrize("route", JOB_ROUTES)
def test_every_job_route_is_404_for_another_project(api: Api, route: str) -> None:
    owner = api.token("owner")
    job = api.submit(owner)
    ckpt = api.add_checkpoint(job["id"], 1)
    api.add_metrics(job["id"], "loss", [1.0])
    url = route.format(job=job["id"], ckpt=ckpt["id"])
    api.force_status(job["id"], "succeeded")  # so the owner's stream ends
    assert api.client.get(url, headers=owner).status_code == 200
    response = api.client.get(url, headers=api.token("intruder"))
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
