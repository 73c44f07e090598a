"""Cluster routes: workers, liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from jobcore.jobs.states import JobStatus
from server.cluster import prometheus, service
from server.cluster.schemas import Health, Readiness, WorkerList, WorkerOut
from server.deps import ReadPrincipal, SessionDep, SettingsDep
from server.errors import error_responses

router = APIRouter(tags=["cluster"])


@router.get(
    "/v1/workers",
    operation_id="listWorkers",
    response_model=WorkerList,
    responses=error_responses(401, 403, 429),
)
def list_workers(session: SessionDep, principal: ReadPrincipal, settings: SettingsDep) -> WorkerList:
    """Workers with their GPUs (those running jobs hold, and those serving hosts on the same
    machine hold), running jobs and last heartbeat."""
    rows = service.list_workers(session, principal, settings.stale_after_seconds)
    data = [WorkerOut.model_validate(w) for w in rows]
    return WorkerList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None)


@router.get("/healthz", operation_id="healthz", response_model=Health)
def healthz() -> Health:
    """The process is alive (no dependency is checked)."""
    return Health()


@router.get(
    "/readyz",
    operation_id="readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "A dependency is unreachable"}},
)
async def readyz(request: Request, settings: SettingsDep) -> JSONResponse:
    """The database and the broker answer."""
    factory = request.app.state.session_factory

    def check_database() -> str | None:
        with factory() as session:
            return service.database_ok(session)

    checks: dict[str, str] = {}
    for name, probe in (("database", check_database), ("broker", lambda: service.broker_ok(settings))):
        problem = await anyio.to_thread.run_sync(probe)
        checks[name] = problem or "ok"
    ready = all(v == "ok" for v in checks.values())
    body = Readiness(status="ok" if ready else "unavailable", checks=checks)
    return JSONResponse(status_code=200 if ready else 503, content=body.model_dump())


@router.get(
    "/metrics",
    operation_id="prometheusMetrics",
    response_class=PlainTextResponse,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"}
    },
)
def metrics(request: Request, session: SessionDep) -> PlainTextResponse:
    """Prometheus metrics: jobs by status, queue depth, events ingested, workers, API latency."""
    counts = service.job_counts(session)
    lines = prometheus.gauge(
        "twinkle_jobs", "Jobs by status.", [({"status": status}, n) for status, n in sorted(counts.items())]
    )
    lines += prometheus.gauge(
        "twinkle_queue_depth", "Jobs waiting to be claimed.", [({}, counts[JobStatus.QUEUED])]
    )
    lines += prometheus.counter(
        "twinkle_events_ingested_total", "Job events written.", service.events_ingested(session)
    )
    lines += prometheus.gauge(
        "twinkle_workers_online", "Registered workers online.", [({}, service.online_workers(session))]
    )
    lines += request.app.state.latency.render()
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")
