"""The job page's buttons are the job's `actions`, as the server publishes them, and nothing else.

Against a real server (no worker, so a job stays where the buttons put it): the buttons equal
the API's `actions` in every status the page walks through, down to deleting the cancelled job.
Then the server's answers are rewritten in the browser to stand for a server with one more action
and one more status than the dashboard was written for: the page still shows exactly what it is
given, labels the new action from its name and files the unknown status under "All".
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from test_dashboard import sign_in
from test_dashboard_controls import badge_is

BUTTONS = "() => [...document.querySelectorAll('.page-head .actions button')].map((b) => b.dataset.action)"


def submit_job(stack: Any, tmp_path: Path, tiny_model_dir: Path, name: str) -> dict[str, Any]:
    from twinkle_core.assets import write_text_dataset

    train = write_text_dataset(tmp_path / "train.jsonl", n=16)
    spec = {"model": {"model_id": str(tiny_model_dir)}, "data": {"train_file": str(train), "max_length": 32}}
    with stack.api() as api:
        response = api.post("/v1/jobs", json={"name": name, "spec": spec})
        assert response.status_code == 201, response.text
        return dict(response.json())


def api_job(stack: Any, job_id: str) -> dict[str, Any]:
    with stack.api() as api:
        return dict(api.get(f"/v1/jobs/{job_id}").json())


def buttons_are(page: Any, actions: list[str]) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"want => JSON.stringify(({BUTTONS})()) === JSON.stringify(want)", arg=actions)
    except PlaywrightTimeout:
        # What the page showed instead names the failure (it failed once in CI, 12-05, and did not
        # come back in six reruns, two of them under a full CPU load).
        head = page.evaluate("() => document.querySelector('.page-head')?.innerText")
        raise AssertionError(
            f"buttons {page.evaluate(BUTTONS)}, wanted {actions}; at {page.url}; page head: {head!r}"
        ) from None


def test_the_buttons_are_the_jobs_actions_in_every_status(
    stack: Any, page: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    job_id = submit_job(stack, tmp_path, tiny_model_dir, "e2e-actions")["id"]
    page.on("dialog", lambda dialog: dialog.accept())  # cancel and delete ask first
    sign_in(page, stack.url, stack.token)
    page.wait_for_url(re.compile(r"#/jobs"))
    page.goto(f"{stack.url}/#/jobs/{job_id}")
    for action, status in (("pause", "paused"), ("cancel", "cancelled"), ("delete", None)):
        job = api_job(stack, job_id)
        badge_is(page, job["status"], 15_000)
        buttons_are(page, job["actions"])
        assert page.evaluate(BUTTONS) == job["actions"] and action in job["actions"]
        page.click(f'.page-head .actions [data-action="{action}"]')
        if status is not None:
            badge_is(page, status, 15_000)
    assert job["terminal"] is True and job["actions"] == ["resume", "clone", "delete"]
    page.wait_for_url(re.compile(r"#/jobs$"))
    with stack.api() as api:
        assert api.get(f"/v1/jobs/{job_id}").status_code == 404


def test_an_action_and_a_status_the_dashboard_never_heard_of(
    stack: Any, page: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    job_id = submit_job(stack, tmp_path, tiny_model_dir, "e2e-future")["id"]
    with stack.api() as api:
        assert api.post(f"/v1/jobs/{job_id}/pause").json()["status"] == "paused"
    job_url = f"{stack.url}/v1/jobs/{job_id}"
    offered = {"actions": ["rewind", "cancel", "clone"]}
    posted: list[str] = []

    def rewrite_job(route: Any) -> None:
        answer = route.fetch()
        route.fulfill(response=answer, json={**answer.json(), **offered})

    def rewind(route: Any) -> None:
        posted.append(route.request.method)
        route.fulfill(content_type="application/json", body=json.dumps({**api_job(stack, job_id), **offered}))

    def checkpoints(route: Any) -> None:
        checkpoint = {"id": "ckpt-1", "step": 4, "metrics": {}, "size_bytes": 10, "is_best": False}
        created = {"created_at": "2024-01-01T00:00:00Z", "path": "/x", "object": "checkpoint"}
        route.fulfill(content_type="application/json", body=json.dumps({"data": [{**checkpoint, **created}]}))

    page.route(job_url, rewrite_job)
    page.route(f"{job_url}/rewind", rewind)
    page.route(re.compile(re.escape(f"{job_url}/checkpoints") + r"(\?.*)?$"), checkpoints)
    sign_in(page, stack.url, stack.token)
    page.wait_for_url(re.compile(r"#/jobs"))
    page.goto(f"{stack.url}/#/jobs/{job_id}")
    badge_is(page, "paused", 15_000)
    buttons_are(page, offered["actions"])
    assert page.locator('.page-head .actions [data-action="rewind"]').inner_text() == "Rewind"
    # Paused, but the server does not offer resume: no resuming from a checkpoint either.
    resume_from = page.locator('.checkpoints-table [data-action="resume-from"]')
    resume_from.wait_for()
    assert resume_from.is_disabled()
    page.click('.page-head .actions [data-action="rewind"]')
    page.get_by_text("Rewind: the job is now paused").wait_for()
    assert posted == ["POST"]

    offered["actions"] = ["resume", "cancel", "clone"]
    page.reload()
    buttons_are(page, offered["actions"])
    page.wait_for_function(
        "() => document.querySelector('.checkpoints-table [data-action=\"resume-from\"]')?.disabled === false"
    )

    # A status no filter chip names still lists under "All".
    def rewrite_list(route: Any) -> None:
        answer = route.fetch()
        page_of_jobs = answer.json()
        for job in page_of_jobs["data"]:
            job["status"] = "archived"
        route.fulfill(response=answer, json=page_of_jobs)

    page.route(re.compile(re.escape(f"{stack.url}/v1/jobs") + r"(\?.*)?$"), rewrite_list)
    page.goto(f"{stack.url}/#/jobs")
    row = page.locator(f'tr[data-job-id="{job_id}"]')
    row.wait_for()
    assert row.get_attribute("data-status") == "archived"
    assert page.locator('.chip[data-filter="all"]').get_attribute("aria-pressed") == "true"


def test_a_job_page_left_while_loading_leaves_nothing_behind(
    stack: Any, page: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    # The first load of the job is held back; the user goes to the jobs list and back to the job
    # meanwhile. When the held answer comes, its page must not join the one now shown (a stale
    # mount once added its buttons beside the current page's: CI, 12-05 and 12-06).
    job_id = submit_job(stack, tmp_path, tiny_model_dir, "e2e-stale")["id"]
    sign_in(page, stack.url, stack.token)
    page.wait_for_url(re.compile(r"#/jobs"))
    held: list[Any] = []
    page.route(f"**/v1/jobs/{job_id}", lambda route: held.append(route) if not held else route.continue_())
    page.goto(f"{stack.url}/#/jobs/{job_id}")
    page.wait_for_timeout(300)
    assert len(held) == 1  # the first mount is waiting for its job
    page.evaluate("() => { location.hash = '#/jobs'; }")
    page.wait_for_timeout(300)
    page.evaluate(f"() => {{ location.hash = '#/jobs/{job_id}'; }}")
    buttons_are(page, api_job(stack, job_id)["actions"])
    held[0].continue_()  # the stale mount now gets its job
    page.wait_for_timeout(1000)
    buttons_are(page, api_job(stack, job_id)["actions"])
    assert page.evaluate("() => document.querySelectorAll('.page-head').length") == 1
