"""The dashboard's job controls and live views in a real browser, against a real server and worker.

The job here is given far more steps than it can run during the test, so it is still running
whenever the test acts on it (no race with a job that ends early). Its life:

queued (no worker yet): Pause and Resume buttons -> the jobs list open while a worker starts, so
the row turns `running` without a reload -> the job page: ETA, loss and eval-loss charts, a
checkpoint -> Pause (the run checkpoints and stops) -> "Resume from here" on the earliest
checkpoint -> running again -> the workers page names the host and the job.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from test_dashboard import sign_in

pytestmark = pytest.mark.slow

SAVE_EVERY = 4
HOST = "e2e-worker-host"


def badge_is(page: Any, status: str, timeout_ms: int) -> None:
    page.wait_for_function(
        "s => document.querySelector('.title-row .badge')?.dataset.status === s",
        arg=status,
        timeout=timeout_ms,
    )


def submit_long_job(stack: Any, tmp_path: Path, tiny_model_dir: Path) -> str:
    from twinkle_core.assets import write_text_dataset

    train = write_text_dataset(tmp_path / "train.jsonl", n=64)
    validation = write_text_dataset(tmp_path / "valid.jsonl", n=8, seed=1)
    spec = {
        "model": {"model_id": str(tiny_model_dir), "mixed_precision": "no"},
        "data": {"train_file": str(train), "validation_file": str(validation), "max_length": 32},
        # Never reached during the test: the job is running whenever the test acts on it.
        "training": {
            "max_steps": 100_000,
            "batch_size": 4,
            "log_every": 1,
            "eval_every": 2,
            "save_every": SAVE_EVERY,
            "save_total_limit": None,
        },
        "optimizer": {"lr": 1e-3},
        "resources": {"nproc_per_node": 1},
    }
    with stack.api() as api:
        response = api.post("/v1/jobs", json={"name": "e2e-controls", "spec": spec})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


def test_pause_resume_from_a_checkpoint_and_live_views(
    stack: Any, page: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    started = time.monotonic()
    job_id = submit_long_job(stack, tmp_path, tiny_model_dir)
    sign_in(page, stack.url, stack.token)
    page.wait_for_url(re.compile(r"#/jobs"))

    # Pause and Resume on a queued job (no worker yet, so it stays where the buttons put it).
    page.goto(f"{stack.url}/#/jobs/{job_id}")
    badge_is(page, "queued", 15_000)
    page.click('.job-page [data-action="pause"]')
    badge_is(page, "paused", 15_000)
    assert page.locator('.job-page [data-action="pause"]').count() == 0
    page.click('.job-page [data-action="resume"]')
    badge_is(page, "queued", 15_000)

    # The jobs list follows the status live: a worker starts while the list is open.
    page.click('nav a[data-nav="jobs"]')
    row = page.locator(f'tr[data-job-id="{job_id}"]')
    row.wait_for()
    assert row.get_attribute("data-status") == "queued"
    page.evaluate("window.__notReloaded = true")
    stack.env["TWINKLE_WORKER_HOST"] = HOST
    stack.start_worker()
    page.wait_for_function(
        "id => document.querySelector(`tr[data-job-id=\"${id}\"]`)?.dataset.status === 'running'",
        arg=job_id,
        timeout=120_000,
    )
    assert page.evaluate("window.__notReloaded") is True

    # The job page while it runs: an ETA, train and eval loss drawn from the stream, checkpoints.
    row.click()
    page.wait_for_url(re.compile(rf"#/jobs/{job_id}$"))
    eta = page.locator('.stat[data-stat="eta"] dd')
    page.wait_for_function(
        "() => /\\d/.test(document.querySelector('.stat[data-stat=\"eta\"] dd')?.textContent || '')",
        timeout=60_000,
    )
    assert re.fullmatch(r"\d+[smhd]( \d+[smh])?", eta.inner_text()), eta.inner_text()
    for series, at_least in (("loss", 3), ("eval_loss", 2)):
        page.wait_for_function(
            '([s, n]) => Number(document.querySelector(`.chart-card[data-chart="Loss"] '
            'path[data-series="${s}"]`)?.dataset.points) >= n',
            arg=[series, at_least],
            timeout=60_000,
        )
    checkpoint_rows = page.locator(".checkpoints-table tbody tr")
    checkpoint_rows.first.wait_for(timeout=60_000)
    assert checkpoint_rows.first.locator('[data-action="resume-from"]').is_disabled()  # not while running

    # Pause: the run saves a checkpoint and stops; then resume from the earliest checkpoint.
    page.click('.job-page [data-action="pause"]')
    badge_is(page, "paused", 90_000)
    page.wait_for_function(
        "() => document.querySelector('.checkpoints-table [data-action=\"resume-from\"]')?.disabled === false"
    )
    steps = checkpoint_rows.evaluate_all("rows => rows.map(r => Number(r.dataset.step))")
    earliest = min(steps)
    # Saved every SAVE_EVERY steps, and at every new best eval loss (evaluated every 2 steps):
    # the earliest is step 2 or 4, and resuming from it goes back before the pause checkpoint.
    assert earliest in (2, SAVE_EVERY) and earliest < max(steps), steps
    chosen = page.locator(f'.checkpoints-table tbody tr[data-step="{earliest}"]')
    checkpoint_id = chosen.get_attribute("data-checkpoint-id")
    chosen.locator('[data-action="resume-from"]').click()
    page.get_by_text(f"Resuming from step {earliest}").wait_for()
    badge_is(page, "running", 120_000)
    with stack.api() as api:
        history = api.get(f"/v1/jobs/{job_id}/events", params={"type": "status", "limit": 100}).json()
    messages = [e["message"] for e in history["data"]]
    assert f"resume from checkpoint {checkpoint_id} (step {earliest})" in messages

    # The workers page: the worker's host, its CPU slot and the job it runs.
    page.click('nav a[data-nav="workers"]')
    worker_row = page.locator(".workers-table tbody tr").first
    worker_row.wait_for()
    cells = worker_row.locator("td")
    assert cells.nth(0).inner_text().strip().lower() == "online"
    assert HOST in cells.nth(1).inner_text()
    assert cells.nth(2).inner_text().strip() == "CPU · 1 slot"
    page.wait_for_function(
        "id => [...document.querySelectorAll('.workers-table a')].some(a => a.textContent === id)",
        arg=job_id,
        timeout=15_000,
    )

    with stack.api() as api:
        assert api.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    assert time.monotonic() - started < 120, "the browser test should stay short"
