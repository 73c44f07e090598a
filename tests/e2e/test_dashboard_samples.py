"""The job page shows what the model said at each sampled step (training.sample_every +
sample_prompts), beside the loss: the samples already written when the page opens, and those the
event stream brings while it is open; `twinkle-jobs jobs events` prints them too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_dashboard import sign_in
from test_dashboard_actions import submit_job


def add_sample_event(stack: Any, job_id: str, step: int, completion: str) -> None:
    """What the worker writes for a runner's `sample` record (worker/ingest.py), into the stack's
    own database."""
    from jobcore.db.models import JobEvent
    from jobcore.db.session import session_scope
    from jobcore.settings import Settings

    url = Settings(data_dir=stack.data_dir).resolved_database_url
    samples = [{"prompt": "The cat", "completion": completion}, {"prompt": "A robot", "completion": ""}]
    with session_scope(url) as session:
        session.add(
            JobEvent(
                job_id=job_id,
                type="sample",
                message=f"samples at step {step}",
                data={"step": step, "samples": samples},
            )
        )


def test_samples_appear_beside_the_loss(stack: Any, page: Any, tmp_path: Path, tiny_model_dir: Path) -> None:
    job_id = submit_job(stack, tmp_path, tiny_model_dir, "e2e-samples")["id"]
    sign_in(page, stack.url, stack.token)
    page.wait_for_url(re.compile(r"#/jobs"))
    page.goto(f"{stack.url}/#/jobs/{job_id}")
    page.wait_for_selector(".job-page")
    assert page.locator(".samples").is_hidden()  # no samples yet: no empty card

    add_sample_event(stack, job_id, 2, "likes small boats")
    page.reload()
    page.wait_for_selector('.samples .sample-step[data-step="2"]')
    assert page.locator(".samples").is_visible()
    assert page.inner_text('.samples [data-step="2"] dt >> nth=0') == "The cat"
    assert page.inner_text('.samples [data-step="2"] dd >> nth=0') == "likes small boats"
    assert page.inner_text('.samples [data-step="2"] dd >> nth=1') == "(empty)"

    # Live: a later step arrives over the event stream and goes first.
    add_sample_event(stack, job_id, 4, "likes big boats")
    page.wait_for_selector('.samples .sample-step[data-step="4"]', timeout=15_000)
    steps = page.eval_on_selector_all(".samples .sample-step", "els => els.map((e) => e.dataset.step)")
    assert steps == ["4", "2"]

    # The CLI prints what the model said under each sample event's line, oldest first.
    shown = subprocess.run(
        [sys.executable, "-m", "twinkle_cli.main", "jobs", "events", job_id, "--type", "sample"],
        env={**os.environ, "TWINKLE_URL": stack.url, "TWINKLE_TOKEN": stack.token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert [line.split("  ")[-1] for line in lines[::3]] == ["samples at step 2", "samples at step 4"]
    assert lines[1:3] == ["    'The cat' -> likes small boats", "    'A robot' -> "]
    assert lines[4] == "    'The cat' -> likes big boats"
