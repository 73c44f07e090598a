"""The dashboard in a real browser against a real server and worker.

One test drives the whole path a person takes: sign in, submit a tiny fine-tune from the
generated form, watch it run to `succeeded` with the loss chart drawn from live events,
download a checkpoint, and check the jobs list and workers page. The other checks that invalid
input is named next to its field, both by the form's own checks and from the server's 422.
"""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest

# The README's screenshot is refreshed only on request (TWINKLE_UPDATE_SCREENSHOT=1), so a test
# run never dirties the working tree.
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard.png"
MAX_STEPS = 6
SAVE_EVERY = 3


def sign_in(page: Any, url: str, token: str) -> None:
    page.goto(f"{url}/")
    page.wait_for_url(re.compile(r"#/login"))
    page.fill("#token", token)
    page.click("form.login-card button[type=submit]")


def field(page: Any, path: str) -> Any:
    return page.locator(f'.field[data-path="{path}"]')


def wait_for_terminal_badge(page: Any, timeout_ms: int) -> str | None:
    """The status the job page's badge shows once it is terminal (None: still not after the timeout)."""
    script = (
        "() => ['succeeded', 'failed', 'cancelled']"
        ".includes(document.querySelector('.title-row .badge')?.dataset.status)"
    )
    try:
        page.wait_for_function(script, timeout=timeout_ms)
    except Exception:  # Playwright's TimeoutError: the caller reports the job's real state
        return None
    return page.locator(".title-row .badge").get_attribute("data-status")


def fill_form(page: Any, values: dict[str, str]) -> None:
    for path, value in values.items():
        control = page.locator(f'[name="{path}"]')
        if control.evaluate("el => el.tagName") == "SELECT":
            control.select_option(value)
        else:
            control.fill(value)


@pytest.mark.slow
def test_submit_watch_and_download_a_job(stack: Any, page: Any, tmp_path: Path, tiny_model_dir: Path) -> None:
    from twinkle_core.assets import write_text_dataset

    dataset = write_text_dataset(tmp_path / "train.jsonl", n=64)
    stack.start_worker()

    sign_in(page, stack.url, stack.token)
    page.wait_for_url(re.compile(r"#/jobs"))
    page.get_by_role("heading", name=re.compile("Jobs")).wait_for()
    page.get_by_text("No jobs yet").wait_for()

    page.click('nav a[data-nav="new"]')
    fill_form(
        page,
        {
            "name": "e2e-tiny",
            "spec.model.model_id": str(tiny_model_dir),
            "spec.model.mixed_precision": "no",
            "spec.data.train_file": str(dataset),
            "spec.data.max_length": "32",
            "spec.training.max_steps": str(MAX_STEPS),
            "spec.training.batch_size": "4",
            "spec.training.save_every": str(SAVE_EVERY),
            "spec.optimizer.lr": "1e-3",
            "spec.resources.nproc_per_node": "1",
        },
    )
    page.click("form.submit-form button[type=submit]")
    page.wait_for_url(re.compile(r"#/jobs/job-"))
    job_id = page.url.rsplit("/", 1)[1]

    # The job page follows the run live; allow for torchrun start-up on a busy 2-core machine.
    status = wait_for_terminal_badge(page, timeout_ms=300_000)
    with stack.api() as api:
        job = api.get(f"/v1/jobs/{job_id}").json()
    assert status == job["status"] == "succeeded", f"{job['status']}: {job.get('error')}\n{stack.logs()}"
    assert job["name"] == "e2e-tiny"
    # The form sent what was typed, and left the rest to the server's defaults.
    assert job["spec"]["model"]["mixed_precision"] == "no"
    assert job["spec"]["optimizer"]["lr"] == pytest.approx(1e-3)
    assert job["spec"]["training"]["save_every"] == SAVE_EVERY
    assert job["spec"]["scheduler"]["name"] == "cosine"

    assert page.locator(".progress-steps").inner_text() == f"step {MAX_STEPS} / {MAX_STEPS}"
    # One loss point per step, drawn as a path through every point.
    loss_path = page.locator('.chart-card[data-chart="Loss"] path[data-series="loss"]')
    loss_path.wait_for()
    page.wait_for_function(
        'n => document.querySelector(\'.chart-card[data-chart="Loss"] path[data-series="loss"]\')'
        "?.dataset.points == n",
        arg=str(MAX_STEPS),
    )
    d = loss_path.get_attribute("d") or ""
    assert len(re.findall(r"[ML]-?[\d.]+,-?[\d.]+", d)) == MAX_STEPS
    assert page.locator('.chart-card[data-chart="Learning rate"] path[data-series="lr"]').count() == 1

    rows = page.locator(".checkpoints-table tbody tr")
    rows.first.wait_for()
    steps = sorted(int(s) for s in rows.evaluate_all("rows => rows.map(r => r.dataset.step)"))
    assert steps[-1] == MAX_STEPS and SAVE_EVERY in steps
    # A succeeded job cannot be resumed: the button says so instead of failing on click.
    assert rows.first.locator('[data-action="resume-from"]').is_disabled()
    with page.expect_download() as download_info:
        rows.first.locator('[data-action="download"]').click()
    saved = tmp_path / "checkpoint.tar"
    download_info.value.save_as(saved)
    assert saved.stat().st_size > 0
    with tarfile.open(saved) as archive:
        assert any(name.endswith("config.json") for name in archive.getnames())

    assert page.locator('.events li[data-type="status"]').count() >= 2
    assert page.locator('[aria-label="Log files"] .tab').count() >= 1

    page.evaluate("document.getElementById('toasts').replaceChildren(); window.scrollTo(0, 0)")
    screenshot = (
        DOCS_SCREENSHOT if os.environ.get("TWINKLE_UPDATE_SCREENSHOT") else tmp_path / "dashboard.png"
    )
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000

    # Clone, then cancel the clone from its page (the cancel button asks for confirmation).
    page.on("dialog", lambda dialog: dialog.accept())
    page.click('.job-page [data-action="clone"]')
    page.wait_for_url(lambda url: "#/jobs/job-" in url and job_id not in url)
    clone_id = page.url.rsplit("/", 1)[1]
    page.locator('.job-page [data-action="cancel"]').click()
    assert wait_for_terminal_badge(page, timeout_ms=120_000) == "cancelled", stack.logs()

    # The jobs list shows both; the status chips filter on the server.
    page.click('nav a[data-nav="jobs"]')
    row = page.locator(f'tr[data-job-id="{job_id}"]')
    clone_row = page.locator(f'tr[data-job-id="{clone_id}"]')
    row.wait_for()
    assert row.get_attribute("data-status") == "succeeded"
    assert clone_row.get_attribute("data-status") == "cancelled"
    page.click('.chip[data-filter="failed"]')
    page.get_by_text("No failed jobs").wait_for()
    page.click('.chip[data-filter="succeeded"]')
    row.wait_for()
    assert page.locator(".jobs-table tbody tr").count() == 1

    # A GPU machine whose GPU 1 a serving host holds: the workers page marks it as serving.
    add_gpu_worker_with_a_serving_gpu(stack.data_dir)
    page.click('nav a[data-nav="workers"]')
    page.locator(".workers-table tbody tr").first.wait_for()
    chips = page.locator('tr[data-worker-id="wkr-e2e-gpu"] .gpu')
    chips.first.wait_for()
    assert chips.all_inner_texts() == ["GPU 0", "GPU 1"]
    serving = page.locator('tr[data-worker-id="wkr-e2e-gpu"] .gpu.serving')
    assert serving.all_inner_texts() == ["GPU 1"]
    assert serving.get_attribute("title") == "held by a serving host"


def add_gpu_worker_with_a_serving_gpu(data_dir: Path) -> None:
    from jobcore import gpu_leases
    from jobcore.db.models import WorkerNode
    from jobcore.db.session import session_scope
    from jobcore.settings import Settings

    settings = Settings(data_dir=data_dir, database_url=None)
    with session_scope(settings.resolved_database_url) as session:
        session.add(WorkerNode(id="wkr-e2e-gpu", host="gpu-e2e", pid=1, gpus=["0", "1"], slots=2))
        gpu_leases.take(
            session,
            "gpu-e2e",
            "serve-e2e",
            "serve-e2e",
            gpu_leases.SERVING,
            ["1"],
            settings.stale_after_seconds,
        )


def test_invalid_fields_are_named_inline(stack: Any, page: Any, tmp_path: Path, tiny_model_dir: Path) -> None:
    from twinkle_core.assets import write_text_dataset

    dataset = write_text_dataset(tmp_path / "train.jsonl", n=8)

    sign_in(page, stack.url, token="tw-not-a-token")
    page.get_by_text("invalid, revoked or expired token").wait_for()
    page.fill("#token", stack.token)
    page.click("form.login-card button[type=submit]")
    page.wait_for_url(re.compile(r"#/jobs"))

    page.goto(f"{stack.url}/#/new")
    fill_form(page, {"spec.model.model_id": str(tiny_model_dir), "spec.data.max_length": "1"})
    page.click("form.submit-form button[type=submit]")
    # Checked in the browser from the schema: a required field and a minimum.
    error = field(page, "spec.data.max_length").locator(".field-error")
    error.wait_for()
    assert "greater than or equal to 8" in error.inner_text()
    assert "is required" in field(page, "spec.data.train_file").locator(".field-error").inner_text()

    # Only the server knows the allowed roots: its 422 `param` puts the message at the field.
    fill_form(page, {"spec.data.max_length": "32", "spec.data.train_file": str(dataset)})
    fill_form(page, {"spec.model.model_id": "/definitely/not/an/allowed/root"})
    page.click("form.submit-form button[type=submit]")
    server_error = field(page, "spec.model.model_id").locator(".field-error")
    server_error.wait_for()
    assert "outside the allowed data roots" in server_error.inner_text()
    assert field(page, "spec.data.max_length").locator(".field-error").is_hidden()
    with stack.api() as api:
        assert api.get("/v1/jobs").json()["data"] == []

    # Sign out forgets the token.
    page.click("#sign-out")
    page.wait_for_url(re.compile(r"#/login"))
    assert page.evaluate("localStorage.getItem('twinkle.apiToken')") is None


def test_jobs_list_pages_with_the_cursor_and_filters(
    stack: Any, page: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """25 queued jobs (no worker runs): a first page of 20, "Load more" for the rest, chips filter."""
    from twinkle_core.assets import write_text_dataset

    dataset = write_text_dataset(tmp_path / "train.jsonl", n=8)
    spec = {"model": {"model_id": str(tiny_model_dir)}, "data": {"train_file": str(dataset)}}
    with stack.api() as api:
        ids = [
            api.post("/v1/jobs", json={"name": f"job-{i:02d}", "spec": spec}).json()["id"] for i in range(25)
        ]
        assert api.post(f"/v1/jobs/{ids[0]}/cancel").json()["status"] == "cancelled"

    sign_in(page, stack.url, stack.token)
    rows = page.locator(".jobs-table tbody tr")
    rows.nth(19).wait_for()
    assert rows.count() == 20
    assert rows.first.get_attribute("data-job-id") == ids[-1]  # newest first
    page.get_by_role("button", name="Load more").click()
    rows.nth(24).wait_for()
    assert page.get_by_role("button", name="Load more").is_hidden()
    # The 2-second refresh keeps every loaded row, not just the first page.
    page.wait_for_timeout(2500)
    assert rows.count() == 25

    page.click('.chip[data-filter="cancelled"]')
    page.wait_for_function("() => document.querySelectorAll('.jobs-table tbody tr').length === 1")
    assert rows.first.get_attribute("data-job-id") == ids[0]
    assert page.url.endswith("#/jobs?status=cancelled")
    page.click('.chip[data-filter="queued"]')
    page.wait_for_function("() => document.querySelectorAll('.jobs-table tbody tr').length === 20")
