"""Job actions beyond the state table: resume from checkpoints, clone with overrides, delete artifacts."""

from __future__ import annotations

from test_api_support import *  # noqa: F403
from test_api_support import Api

from jobcore.db.models import Job, JobEvent


def test_resume_uses_the_latest_checkpoint_and_wakes_a_worker(api: Api) -> None:
    job = api.submit()
    api.add_checkpoint(job["id"], 10)
    latest = api.add_checkpoint(job["id"], 20)
    api.force_status(job["id"], "failed", error={"kind": "infra", "message": "node lost"})
    api.dispatched.clear()
    response = api.client.post(f"/v1/jobs/{job['id']}/resume", headers=api.admin)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "queued" and body["resume_from"] == latest["path"]
    assert body["error"] is None and body["finished_at"] is None and body["queue_position"] == 1
    assert api.dispatched == [job["id"]]


def test_resume_from_a_named_checkpoint_or_an_unknown_one(api: Api) -> None:
    job = api.submit()
    first = api.add_checkpoint(job["id"], 10)
    api.add_checkpoint(job["id"], 20)
    api.force_status(job["id"], "paused")
    missing = api.client.post(
        f"/v1/jobs/{job['id']}/resume", json={"checkpoint": "ckpt-nope"}, headers=api.admin
    )
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "checkpoint"
    response = api.client.post(
        f"/v1/jobs/{job['id']}/resume", json={"checkpoint": first["id"]}, headers=api.admin
    )
    assert response.json()["resume_from"] == first["path"]
    events = api.client.get(f"/v1/jobs/{job['id']}/events?type=status&order=desc&limit=1", headers=api.admin)
    assert f"resume from checkpoint {first['id']}" in events.json()["data"][0]["message"]


def test_resume_without_checkpoints_starts_over(api: Api) -> None:
    job = api.submit()
    api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=api.admin)
    response = api.client.post(f"/v1/jobs/{job['id']}/resume", headers=api.admin)
    assert response.json()["status"] == "queued" and response.json()["resume_from"] is None


def test_resume_of_a_failed_job_starts_fresh_budgets_a_paused_one_keeps_them(api: Api) -> None:
    failed, paused = api.submit(), api.submit()
    spent = {"failed_attempts": 3, "run_seconds": 500.0, "attempt": 4}
    api.force_status(failed["id"], "failed", error={"kind": "infra", "message": "out of retries"}, **spent)
    api.force_status(paused["id"], "paused", **spent)
    body = api.client.post(f"/v1/jobs/{failed['id']}/resume", headers=api.admin).json()
    assert (body["status"], body["failed_attempts"], body["attempt"]) == ("queued", 0, 4)
    body = api.client.post(f"/v1/jobs/{paused['id']}/resume", headers=api.admin).json()
    assert (body["status"], body["failed_attempts"]) == ("queued", 3)
    with api.session() as session:
        assert session.get_one(Job, failed["id"]).run_seconds == 0.0
        assert session.get_one(Job, paused["id"]).run_seconds == 500.0


def test_clone_merges_spec_overrides_into_a_new_queued_job(api: Api) -> None:
    source = api.submit(name="base", metadata={"team": "nlp"}, priority=3)
    api.force_status(source["id"], "succeeded")
    api.dispatched.clear()
    body = {"name": "lr-sweep", "spec": {"optimizer": {"lr": 2e-5}, "training": {"max_steps": 7}}}
    response = api.client.post(f"/v1/jobs/{source['id']}/clone", json=body, headers=api.admin)
    assert response.status_code == 201, response.text
    clone = response.json()
    assert clone["id"] != source["id"] and clone["status"] == "queued" and clone["name"] == "lr-sweep"
    assert clone["spec"]["optimizer"]["lr"] == 2e-5 and clone["spec"]["training"]["max_steps"] == 7
    assert clone["spec"]["optimizer"]["name"] == "adamw"  # kept from the source
    assert clone["spec"]["model"] == source["spec"]["model"]
    assert clone["metadata"] == {"team": "nlp"} and clone["priority"] == 3
    assert api.dispatched == [clone["id"]]
    with api.session() as session:
        messages = [e.message for e in session.query(JobEvent).filter(JobEvent.job_id == clone["id"])]
    assert f"cloned from {source['id']}" in messages


def test_clone_rejects_bad_overrides_naming_the_field(api: Api) -> None:
    source = api.submit()
    url = f"/v1/jobs/{source['id']}/clone"
    bad_lr = api.client.post(url, json={"spec": {"optimizer": {"lr": -1}}}, headers=api.admin)
    assert bad_lr.status_code == 422 and bad_lr.json()["error"]["param"] == "spec.optimizer.lr"
    unknown = api.client.post(url, json={"spec": {"optimizer": {"lrr": 1}}}, headers=api.admin)
    assert unknown.json()["error"]["param"] == "spec.optimizer.lrr"
    assert unknown.json()["error"]["message"].endswith("(did you mean 'spec.optimizer.lr'?)")
    outside = api.client.post(url, json={"spec": {"data": {"train_file": "/etc/hosts"}}}, headers=api.admin)
    assert outside.json()["error"]["param"] == "spec.data.train_file"
    assert api.client.post(url, json={"colour": 1}, headers=api.admin).json()["error"]["param"] == "colour"
    assert api.client.post("/v1/jobs/job-nope/clone", headers=api.admin).status_code == 404


def test_delete_removes_rows_and_artifacts(api: Api) -> None:
    job = api.submit()
    checkpoint = api.add_checkpoint(job["id"], 5)
    api.add_event(job["id"], "hello")
    download = api.client.get(
        f"/v1/jobs/{job['id']}/checkpoints/{checkpoint['id']}/download", headers=api.admin
    )
    assert download.status_code == 200
    archive = api.settings.data_dir / "archives" / f"{checkpoint['id']}.tar"
    job_dir = api.settings.jobs_dir / job["id"]
    assert archive.exists() and job_dir.exists()
    api.force_status(job["id"], "succeeded")
    assert api.client.delete(f"/v1/jobs/{job['id']}", headers=api.admin).status_code == 200
    assert not job_dir.exists() and not archive.exists()
    with api.session() as session:
        assert session.query(JobEvent).filter(JobEvent.job_id == job["id"]).count() == 0


def test_delete_never_removes_a_job_dir_outside_the_data_dir(api: Api, tmp_path: object) -> None:
    from pathlib import Path

    outside = Path(str(tmp_path)) / "precious"
    outside.mkdir()
    job = api.submit()
    api.force_status(job["id"], "failed", job_dir=str(outside))
    assert api.client.delete(f"/v1/jobs/{job['id']}", headers=api.admin).status_code == 200
    assert outside.exists()


def test_actions_on_another_projects_job_are_404(api: Api) -> None:
    job = api.submit(api.token("a"))
    other = api.token("b")
    for action in ("cancel", "pause", "resume", "clone"):
        assert api.client.post(f"/v1/jobs/{job['id']}/{action}", headers=other).status_code == 404
    assert api.client.delete(f"/v1/jobs/{job['id']}", headers=other).status_code == 404
    with api.session() as session:
        assert session.query(JobEvent).filter(JobEvent.job_id == job["id"]).count() == 1
