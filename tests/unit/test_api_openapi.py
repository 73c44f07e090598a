"""The committed OpenAPI document is current and documents what clients rely on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = ROOT / "openapi" / "openapi.json"


def test_committed_openapi_is_current() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_openapi.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr + "\nRegenerate with: python scripts/gen_openapi.py"


def test_check_fails_when_stale(tmp_path: Path) -> None:
    stale = tmp_path / "openapi.json"
    stale.write_text("{}\n")
    result = subprocess.run(
        [sys.executable, "scripts/gen_openapi.py", "--check", "--output", str(stale)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "stale" in result.stderr


def test_operations_have_stable_ids_and_documented_errors() -> None:
    document = json.loads(DOCUMENT.read_text())
    operations = {
        (path, method): op for path, methods in document["paths"].items() for method, op in methods.items()
    }
    ids = [op["operationId"] for op in operations.values()]
    assert len(ids) == len(set(ids))
    assert {
        "createJob",
        "listJobs",
        "getJob",
        "cancelJob",
        "pauseJob",
        "resumeJob",
        "cloneJob",
        "deleteJob",
        "listJobEvents",
        "streamJobEvents",
        "getJobMetrics",
        "getJobLogs",
        "listCheckpoints",
        "downloadCheckpoint",
        "uploadFile",
        "listFiles",
        "getFile",
        "downloadFile",
        "deleteFile",
        "listWorkers",
        "healthz",
        "readyz",
        "prometheusMetrics",
    } <= set(ids)
    for (path, _), op in operations.items():
        if path.startswith("/v1/"):
            assert {"401", "403", "429"} <= set(op["responses"]), path
            assert op["responses"]["401"]["content"]["application/json"]["schema"]["$ref"].endswith(
                "/ErrorResponse"
            )
    create = operations[("/v1/jobs", "post")]
    assert {"200", "201", "409", "422"} <= set(create["responses"])
    assert document["components"]["schemas"]["JobCreate"]["examples"]
    # A refused value: 400 on the routes shaped after OpenAI's, as OpenAI answers it, 422 on the
    # native ones; never FastAPI's own `{"detail": [...]}` 422, which the API does not send.
    assert "HTTPValidationError" not in document["components"]["schemas"]
    shaped = {key for key, op in operations.items() if {"openai-compatible", "inference"} & set(op["tags"])}
    for key in (("/v1/fine_tuning/jobs", "post"), ("/v1/chat/completions", "post"), ("/v1/models", "get")):
        assert key in shaped
    for key, op in operations.items():
        if key[0].startswith("/v1/"):
            refusal = "400" if key in shaped else "422"
            assert refusal in op["responses"] and (key not in shaped or "422" not in op["responses"]), key
            assert op["responses"][refusal]["content"]["application/json"]["schema"]["$ref"].endswith(
                "/ErrorResponse"
            )


def test_the_job_object_publishes_the_status_and_action_vocabulary() -> None:
    """Clients read statuses and actions from the document: it lists every one jobcore defines."""
    from jobcore.jobs.states import JobAction, JobStatus

    schemas = json.loads(DOCUMENT.read_text())["components"]["schemas"]
    job = schemas["JobOut"]["properties"]
    assert job["status"] == {"$ref": "#/components/schemas/JobStatus"}
    assert schemas["JobStatus"]["enum"] == [s.value for s in JobStatus]
    assert job["actions"]["items"] == {"$ref": "#/components/schemas/JobAction"}
    assert schemas["JobAction"]["enum"] == [a.value for a in JobAction]
    assert job["terminal"]["type"] == "boolean"
    assert {"status", "actions", "terminal"} <= set(schemas["JobOut"]["required"])
