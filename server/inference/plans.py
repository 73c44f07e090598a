"""What a generation request reads from SQL before its relay, kept for moments per database.

Before a byte goes to a host, a request resolves its `model` to a checkpoint (one statement)
and reads the live serving hosts (another): with the checkout of a pooled connection, ~1.2 ms of
the API server's work on each request's way to its first token (a py-spy profile of the server
under bench/bench_serving_api.py). Both change rarely against the rate of requests, so both are
kept briefly, as a token's principal is (`server.auth.cache`), and a warm request reads nothing:

- A resolved model, per project and name, for `MODEL_TTL_SECONDS`. A job deleted through this
  process is forgotten at once (`forget_models`). Deleted by another process, or its checkpoint
  dropped by retention, it resolves for at most that long; a host that must load it then finds
  no files and answers 404 naming `model`. Only resolutions are kept: an unknown name reads the
  database every time, so a job's model is callable the moment the job succeeded.
- The live hosts for `HOSTS_TTL_SECONDS`, the hosts' default heartbeat period (the `loaded` they
  report may be that old already) and a sixth of the staleness after which a silent host stops
  counting as live. A host that died since is skipped by the relay, which tries the next; an
  empty list is never kept, so the first host to start is seen at once.

A request that finds an entry past half its life reloads it after its response (`refresh_due`,
`refresh`), so a model in steady use never waits for these statements; what is served is never
older than the TTLs above either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

from jobcore.settings import Settings
from server.auth.principal import Principal
from server.common.ttl_cache import PerEngine
from server.errors import NotFound
from server.inference import hosts, service

MODEL_TTL_SECONDS = 5.0
HOSTS_TTL_SECONDS = 5.0
MAX_MODELS = 10_000
_HOSTS_KEY = "live"

# Public for tests, which move their clocks.
model_cache: PerEngine[service.ServedModel] = PerEngine(MODEL_TTL_SECONDS, MAX_MODELS)
host_cache: PerEngine[list[hosts.LiveHost]] = PerEngine(HOSTS_TTL_SECONDS, 1)

Plan = tuple[service.ServedModel, list[hosts.LiveHost]]


def _model_key(principal: Principal, model: str) -> str:
    return f"{principal.project_id}\x00{model}"


def cached(engine: Engine, principal: Principal, model: str) -> Plan | None:
    """The plan from this process's caches of the engine's database, without any I/O (None:
    something is missing, `load` it)."""
    served = model_cache(engine).get(_model_key(principal, model))
    if served is None:
        return None
    live = host_cache(engine).get(_HOSTS_KEY)
    return None if live is None else (served, live)


def load(session: Session, engine: Engine, settings: Settings, principal: Principal, model: str) -> Plan:
    """The plan, reading from the database what the caches lack and keeping what it read.

    Raises `NotFound` naming `model` when it resolves to nothing the project can call."""
    served = model_cache(engine).get(_model_key(principal, model))
    if served is None:
        served = _read_model(session, engine, principal, model)
    live = host_cache(engine).get(_HOSTS_KEY)
    if live is None:
        live = _read_hosts(session, engine, settings)
    return served, live


def _read_model(session: Session, engine: Engine, principal: Principal, model: str) -> service.ServedModel:
    """Resolve `model` in SQL and keep it (raises `NotFound`, keeping nothing)."""
    models = model_cache(engine)
    generation = models.generation  # read before the row: a deletion meanwhile refuses the put
    served = service.resolve(session, principal, model)
    models.put(_model_key(principal, model), served, generation)
    return served


def _read_hosts(session: Session, engine: Engine, settings: Settings) -> list[hosts.LiveHost]:
    """The live hosts from SQL, kept unless there are none (an empty list is never kept)."""
    live_hosts = host_cache(engine)
    live = hosts.live_hosts(session, settings)
    if live:
        live_hosts.put(_HOSTS_KEY, live, live_hosts.generation)
    else:
        live_hosts.discard(_HOSTS_KEY)
    return live


@dataclass(frozen=True)
class Due:
    """Which of a warm plan's entries this request reloads after its response."""

    model: bool
    hosts: bool

    def __bool__(self) -> bool:
        return self.model or self.hosts


def refresh_due(engine: Engine, principal: Principal, model: str) -> Due:
    """Claim the reload of a cached plan's entries past half their life (one request each), so
    that steady use of a model never meets them expired (`server.common.ttl_cache`)."""
    return Due(
        model=model_cache(engine).claim_refresh(_model_key(principal, model)),
        hosts=host_cache(engine).claim_refresh(_HOSTS_KEY),
    )


def refresh(
    session: Session, engine: Engine, settings: Settings, principal: Principal, model: str, due: Due
) -> None:
    """Reload what `due` names, after a response (nobody waits): a model that no longer resolves
    and an empty host list leave the cache, so the next request reads the database and answers
    as it would have (404 naming `model`, 503)."""
    if due.model:
        try:
            _read_model(session, engine, principal, model)
        except NotFound:
            model_cache(engine).discard(_model_key(principal, model))
    if due.hosts:
        _read_hosts(session, engine, settings)


def forget_models(session: Session) -> None:
    """Drop this process's resolved models of the session's database, now and after its commit
    (as `server.auth.service.forget_principals` does for tokens): call it when a job goes."""
    bind = session.get_bind()
    cache = model_cache(bind if isinstance(bind, Engine) else bind.engine)
    cache.invalidate()
    event.listen(session, "after_commit", lambda _session: cache.invalidate(), once=True)
