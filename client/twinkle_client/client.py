"""The client's transport (auth, retries, errors) and one namespace per resource."""

from __future__ import annotations

import builtins
import contextlib
import email.utils
import hashlib
import json
import os
import random
import shutil
import tarfile
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import httpx

from twinkle_client.inference import Inference
from twinkle_client.log_follow import follow_job_log
from twinkle_client.paths import segment
from twinkle_client.sse import Message, read_messages

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# The server's largest page (its lists' `limit`); iterating goes on through the pages.
MAX_PAGE_SIZE = 100
MAX_SLEEP = 60.0
# With no deadline, a stream silent for this long (the server sends a keep-alive every 15 s) is
# taken for a dead connection and reopened.
STREAM_IDLE_SECONDS = 60.0
Json = dict[str, Any]


def new_idempotency_key() -> str:
    return f"tw-{uuid.uuid4().hex}"


class APIError(Exception):
    """An error answer from the server, with its envelope's fields."""

    def __init__(self, status_code: int, error: Json, request_id: str | None = None) -> None:
        self.status_code = status_code
        self.type = str(error.get("type", "api_error"))
        self.code = error.get("code")
        self.param = error.get("param")
        self.request_id = request_id
        self.message = str(error.get("message", "")) or f"HTTP {status_code}"
        where = f" (param: {self.param})" if self.param else ""
        super().__init__(f"{status_code} {self.type}: {self.message}{where}")

    @classmethod
    def from_response(cls, response: httpx.Response) -> APIError:
        """The error of an answer with an error status: its envelope, or its text if it has none."""
        try:
            error = response.json().get("error") or {}
        except (json.JSONDecodeError, AttributeError):
            error = {"message": response.text[:500]}
        return cls(response.status_code, error, response.headers.get("x-request-id"))


class TwinkleClient:
    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("TWINKLE_URL") or "http://127.0.0.1:8000").rstrip("/")
        token = token or os.environ.get("TWINKLE_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.max_retries = max_retries
        self.backoff = backoff
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )
        self.jobs = Jobs(self)
        self.files = Files(self)
        self.checkpoints = Checkpoints(self)
        self.exports = Exports(self)
        self.workers = Workers(self)
        self.projects = Projects(self)
        self.tokens = Tokens(self)
        self.inference = Inference(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TwinkleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport -----------------------------------------------------------------------------

    def request(self, method: str, path: str, *, stream: bool = False, **kwargs: Any) -> httpx.Response:
        """Send a request, retrying 429/5xx and connection errors; raise APIError on 4xx/5xx.

        With `stream=True` the body is not read: the caller iterates it and must close the
        response. Only the opening of the response is retried, never a body already consumed.
        """
        attempt = 0
        while True:
            try:
                # Built anew each time: a multipart body re-reads its file from the start.
                response = self._http.send(self._http.build_request(method, path, **kwargs), stream=stream)
            except httpx.TransportError:
                if attempt >= self.max_retries:
                    raise
                self._sleep(attempt, None)
                attempt += 1
                continue
            if response.status_code < 400:
                return response
            if stream:
                response.read()
                response.close()
            if response.status_code in RETRY_STATUSES and attempt < self.max_retries:
                self._sleep(attempt, response.headers.get("Retry-After"))
                attempt += 1
                continue
            raise APIError.from_response(response)

    def download(self, path: str, dest: str | Path) -> Path:
        """Stream a GET of `path` into the file `dest` (its folder made if missing), through
        `dest.part` so a broken download never leaves a file that looks complete, nor a part of
        one; returns `dest`."""
        dest = Path(dest)
        if dest.is_dir():
            raise IsADirectoryError(f"{dest} is a folder; name the file to write")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        response = self.request("GET", path, stream=True)
        try:
            with tmp.open("wb") as fh:
                for chunk in response.iter_bytes():
                    fh.write(chunk)
            tmp.replace(dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            response.close()
        return dest

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def paginate(
        self, path: str, params: Json | None = None, page_size: int = MAX_PAGE_SIZE
    ) -> Iterator[Json]:
        """Every item of a cursor list, fetching pages as the caller iterates."""
        query = {**(params or {}), "limit": page_size}
        while True:
            page = self.json("GET", path, params={k: v for k, v in query.items() if v is not None})
            yield from page["data"]
            if not page.get("has_more") or not page["data"]:
                return
            query["after"] = page["last_id"]

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        """Exponential back-off with jitter, but never shorter than the server's Retry-After."""
        delay = self.backoff * (2**attempt) * (0.5 + random.random() / 2)
        wait = retry_after_seconds(retry_after)
        if wait is not None:
            delay = max(delay, wait)
        time.sleep(min(delay, MAX_SLEEP))

    # -- service -------------------------------------------------------------------------------

    def health(self) -> Json:
        """`/healthz`: the server process answers (`{"status": "ok"}`)."""
        result: Json = self.json("GET", "/healthz")
        return result

    def ready(self) -> Json:
        """`/readyz`: `{"status": "ok"|"unavailable", "checks": {...}}`, asked once, without retries.

        A 503 here is an answer (a dependency is down), not a failure to retry or raise.
        """
        response = self._http.get("/readyz")
        if response.status_code not in (200, 503):
            raise APIError.from_response(response)
        result: Json = response.json()
        return result

    def prometheus_metrics(self) -> str:
        """`/metrics` in the Prometheus text format."""
        return self.request("GET", "/metrics").text


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds a `Retry-After` header asks for: delta-seconds or an HTTP date."""
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class _Resource:
    def __init__(self, client: TwinkleClient) -> None:
        self._c = client


class Jobs(_Resource):
    def create(
        self,
        spec: Json,
        *,
        name: str | None = None,
        priority: int | None = None,
        max_retries: int | None = None,
        timeout_seconds: int | None = None,
        metadata: dict[str, str] | None = None,
        webhook_url: str | None = None,
        idempotency_key: str | None = None,
    ) -> Json:
        body: Json = {"spec": spec}
        for key, value in (
            ("name", name),
            ("priority", priority),
            ("max_retries", max_retries),
            ("timeout_seconds", timeout_seconds),
            ("metadata", metadata),
            ("webhook_url", webhook_url),
        ):
            if value is not None:
                body[key] = value
        # One key per logical create: retries of this call reuse it, so at most one job results.
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        result: Json = self._c.json("POST", "/v1/jobs", json=body, headers=headers)
        return result

    def get(self, job_id: str) -> Json:
        result: Json = self._c.json("GET", f"/v1/jobs/{segment(job_id)}")
        return result

    def list(
        self,
        *,
        status: str | Sequence[str] | None = None,
        name: str | None = None,
        metadata: dict[str, str] | None = None,
        limit: int = 100,
        with_spec: bool = False,
    ) -> Iterator[Json]:
        """Jobs newest first; `status` one or several, `metadata` pairs every job must hold.

        Each job's `spec` is null unless `with_spec` (the server leaves the largest field out of
        lists unless asked: `expand=spec`); `get(job_id)` always has it."""
        statuses = [status] if isinstance(status, str) else builtins.list(status or [])
        pairs = [f"{key}:{value}" for key, value in (metadata or {}).items()]
        params: Json = {"status": statuses or None, "name": name, "metadata": pairs or None}
        if with_spec:
            params["expand"] = ["spec"]
        return self._c.paginate("/v1/jobs", params, page_size=min(limit, MAX_PAGE_SIZE))

    def cancel(self, job_id: str) -> Json:
        result: Json = self._c.json("POST", f"/v1/jobs/{segment(job_id)}/cancel")
        return result

    def pause(self, job_id: str) -> Json:
        result: Json = self._c.json("POST", f"/v1/jobs/{segment(job_id)}/pause")
        return result

    def resume(self, job_id: str, checkpoint: str | None = None) -> Json:
        body = {"checkpoint": checkpoint} if checkpoint else {}
        result: Json = self._c.json("POST", f"/v1/jobs/{segment(job_id)}/resume", json=body)
        return result

    def clone(
        self,
        job_id: str,
        overrides: Json | None = None,
        name: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Json:
        """A new job from `job_id`'s spec with `overrides` merged in; retries never make two."""
        body: Json = {"spec": overrides or {}}
        if name:
            body["name"] = name
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        result: Json = self._c.json("POST", f"/v1/jobs/{segment(job_id)}/clone", json=body, headers=headers)
        return result

    def delete(self, job_id: str) -> Json:
        """Delete an ended job with its events, metrics, checkpoints and files:
        `{"id", "object": "job", "deleted": true}`."""
        result: Json = self._c.json("DELETE", f"/v1/jobs/{segment(job_id)}")
        return result

    def events(
        self,
        job_id: str,
        *,
        after: int | str | None = None,
        order: str = "asc",
        type: str | Sequence[str] | None = None,
        level: str | Sequence[str] | None = None,
    ) -> Iterator[Json]:
        """The job's events (`order="desc"`: newest first), optionally only some types/levels."""
        params: Json = {"after": after, "order": order, "type": _as_list(type), "level": _as_list(level)}
        return self._c.paginate(f"/v1/jobs/{segment(job_id)}/events", params)

    def metrics(
        self, job_id: str, names: builtins.list[str] | None = None, max_points: int | None = None
    ) -> Json:
        params: Json = {"max_points": max_points}
        if names:
            params["name"] = names
        clean = {k: v for k, v in params.items() if v is not None}
        result: Json = self._c.json("GET", f"/v1/jobs/{segment(job_id)}/metrics", params=clean)
        return result

    def logs(
        self,
        job_id: str,
        lines: int = 200,
        attempt: int | None = None,
        *,
        file: str | None = None,
        offset: int | None = None,
        rank: int | None = None,
    ) -> Json:
        """`{"job_id", "files": [{"name", "lines", "truncated", "end"}]}`: the tail of each log
        file (with `rank`, only that global rank's own files); with `file` and `offset` (a
        previous answer's `end`), what that file gained since."""
        params: Json = {"lines": lines, "attempt": attempt, "file": file, "offset": offset, "rank": rank}
        clean = {k: v for k, v in params.items() if v is not None}
        result: Json = self._c.json("GET", f"/v1/jobs/{segment(job_id)}/logs", params=clean)
        return result

    def follow_logs(
        self, job_id: str, *, lines: int = 50, timeout: float | None = None, poll: float = 1.0
    ) -> Iterator[tuple[str, str]]:
        """`(file name, line)` of the job's log (every rank's output) as it is written: the last
        `lines` lines first, then each new one, across retries (each attempt has its own log),
        until the job has ended. With `timeout`, `TimeoutError` once that many seconds pass."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return follow_job_log(
            lambda: self.get(job_id),
            lambda name, offset, count: self.logs(job_id, count, file=name, offset=offset),
            tail=lines,
            poll=poll,
            deadline=deadline,
            on_timeout=lambda: TimeoutError(f"job {job_id} did not end within {timeout} s"),
        )

    def artifacts(self, job_id: str) -> builtins.list[Json]:
        """What the job's trackers (`training.report_to`) wrote: `[{"name", "path", "files", ...}]`."""
        return list(self._c.json("GET", f"/v1/jobs/{segment(job_id)}/artifacts")["data"])

    def download_artifact(self, job_id: str, name: str, dest: str | Path) -> Path:
        """Save tracker `name`'s output (tensorboard, mlflow, wandb) as a tar.gz at `dest`."""
        return self._c.download(f"/v1/jobs/{segment(job_id)}/artifacts/{name}", dest)

    def follow(
        self,
        job_id: str,
        *,
        after: int | str | None = None,
        timeout: float | None = None,
        poll: float = 1.0,
    ) -> Iterator[Json]:
        """Events as they happen (SSE) until the job ends, from the first or after event `after`.

        A dropped stream is reopened with `Last-Event-ID`, so nothing is missed or repeated; a 429
        or 5xx on opening it is retried like any request. With `timeout`, `TimeoutError` is raised
        once that many seconds pass, also while no event arrives.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_id = None if after is None else str(after)
        drops = 0  # consecutive reconnects that brought nothing new
        opened = False  # once the server has answered, a lost connection is a drop to reopen

        def on_open() -> None:
            nonlocal opened
            opened = True

        while True:
            progressed = False
            try:
                with contextlib.closing(self._stream(job_id, last_id, deadline, on_open)) as messages:
                    for message in messages:
                        _check_deadline(deadline, job_id, timeout)
                        if message.event == "end":
                            return
                        if message.event == "error":
                            break  # the server lost its database mid-stream: reopen
                        if message.event and message.data:
                            event: Json = json.loads(message.data)
                            last_id = str(message.id or event["id"])
                            progressed = True
                            yield event
            except httpx.TransportError:
                if not opened:
                    raise  # the server was never reached: the request has spent its own retries
                # A dropped or silent connection, or a server restarting: reopen it below.
            _check_deadline(deadline, job_id, timeout)
            drops = 0 if progressed else drops + 1
            if drops > self._c.max_retries:
                raise ConnectionError(f"the event stream of {job_id} keeps dropping without new events")
            time.sleep(poll if drops else 0.0)

    def _stream(
        self, job_id: str, last_id: str | None, deadline: float | None, on_open: Callable[[], None]
    ) -> Generator[Message, None, None]:
        headers = {"Accept": "text/event-stream"}
        if last_id:
            headers["Last-Event-ID"] = last_id
        idle = STREAM_IDLE_SECONDS
        if deadline is not None:
            # A read never blocks past the deadline, even when not even a keep-alive comes.
            idle = max(0.1, min(idle, deadline - time.monotonic() + 0.1))
        response = self._c.request(
            "GET",
            f"/v1/jobs/{segment(job_id)}/events/stream",
            headers=headers,
            timeout=httpx.Timeout(self._c.timeout, read=idle),
            stream=True,
        )
        on_open()
        try:
            yield from read_messages(response.iter_lines())
        finally:
            response.close()

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 1.0) -> Json:
        """Poll until the server says the job's run ended (`terminal`); `TimeoutError` at `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job["terminal"]:  # the run ended (a resume would start a new attempt)
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job['status']} after {timeout} s")
            time.sleep(poll)


def content_key(path: Path) -> str:
    """An Idempotency-Key for uploading `path`: the same for the same name and content."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    name = hashlib.sha256(path.name.encode()).hexdigest()[:16]
    return f"upload-{digest.hexdigest()}-{name}"


def _as_list(value: str | Sequence[str] | None) -> builtins.list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else builtins.list(value) or None


def _check_deadline(deadline: float | None, job_id: str, timeout: float | None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise TimeoutError(f"job {job_id} did not end within {timeout} s")


class Files(_Resource):
    def upload(
        self, path: str | Path, purpose: str = "fine-tune", *, idempotency_key: str | None = None
    ) -> Json:
        path = Path(path)
        with path.open("rb") as fh:
            return self.upload_fileobj(fh, path.name, purpose, idempotency_key=idempotency_key)

    def upload_once(self, path: str | Path, purpose: str = "fine-tune") -> tuple[Json, bool]:
        """Upload `path` unless a file of the same name and content was uploaded before: the
        file, and whether this call stored it. The Idempotency-Key is made of the name and the
        content's hash, so the server answers a repeat (a pipeline's next run, a submit after a
        refused one) with the first upload, for as long as it keeps that file."""
        path = Path(path)
        headers = {"Idempotency-Key": content_key(path)}
        with path.open("rb") as fh:
            files = {"file": (path.name, fh)}
            response = self._c.request(
                "POST", "/v1/files", files=files, data={"purpose": purpose}, headers=headers
            )
        return response.json(), response.status_code == 201  # 200: the earlier upload, replayed

    def upload_fileobj(
        self,
        fh: IO[bytes],
        filename: str,
        purpose: str = "fine-tune",
        *,
        idempotency_key: str | None = None,
    ) -> Json:
        """Upload a dataset; a retry after a lost answer gets the same file, not a second copy."""
        files = {"file": (filename, fh)}
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        result: Json = self._c.json(
            "POST", "/v1/files", files=files, data={"purpose": purpose}, headers=headers
        )
        return result

    def get(self, file_id: str) -> Json:
        result: Json = self._c.json("GET", f"/v1/files/{segment(file_id)}")
        return result

    def list(self) -> Iterator[Json]:
        return self._c.paginate("/v1/files")

    def content(self, file_id: str) -> bytes:
        return self._c.request("GET", f"/v1/files/{segment(file_id)}/content").content

    def delete(self, file_id: str) -> Json:
        """Delete a file no queued or running job uses: `{"id", "object": "file", "deleted": true}`."""
        result: Json = self._c.json("DELETE", f"/v1/files/{segment(file_id)}")
        return result


class Checkpoints(_Resource):
    def list(self, job_id: str) -> Iterator[Json]:
        return self._c.paginate(f"/v1/jobs/{segment(job_id)}/checkpoints")

    def download(self, job_id: str, checkpoint_id: str, dest: str | Path) -> Path:
        """Stream the checkpoint archive to `dest` (a file path); returns it."""
        path = f"/v1/jobs/{segment(job_id)}/checkpoints/{segment(checkpoint_id)}/download"
        return self._c.download(path, dest)


EXPORT_DONE = ("succeeded", "failed")


class Exports(_Resource):
    """Checkpoints exported as standalone Hugging Face model folders (made by a worker)."""

    def create(self, job_id: str, step: int, merge: bool | None = None) -> Json:
        """Ask for the export of the job's checkpoint at `step`: a LoRA job's adapter merged into
        its base (default) or alone (`merge=False`), a full job's model. Asking again returns the
        same export (and queues a failed one again)."""
        body = {} if merge is None else {"merge": merge}
        return self._c.json("POST", f"/v1/jobs/{segment(job_id)}/checkpoints/{step}/export", json=body)

    def get(self, export_id: str) -> Json:
        return self._c.json("GET", f"/v1/exports/{segment(export_id)}")

    def list(self, job_id: str) -> Iterator[Json]:
        return self._c.paginate(f"/v1/jobs/{segment(job_id)}/exports")

    def wait(self, export_id: str, timeout: float | None = None, poll: float = 1.0) -> Json:
        """Poll until the export succeeded or failed; `TimeoutError` at `timeout` (it goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            export = self.get(export_id)
            if export["status"] in EXPORT_DONE:
                return export
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"export {export_id} is still {export['status']} after {timeout} s")
            time.sleep(poll)

    def download(self, export_id: str, dest: str | Path) -> Path:
        """Stream the export's tar archive to the file `dest`; returns it."""
        return self._c.download(f"/v1/exports/{segment(export_id)}/content", dest)

    def download_folder(self, export_id: str, dest: str | Path) -> Path:
        """Download and unpack the export into the folder `dest` (which must not exist yet), ready
        for `from_pretrained(dest)`; returns it."""
        dest = Path(dest)
        if dest.exists():
            raise FileExistsError(f"{dest} exists already")
        dest.parent.mkdir(parents=True, exist_ok=True)
        scratch = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}"
        scratch.mkdir()
        try:
            archive = self.download(export_id, scratch / "export.tar")
            root = _unpack(archive, scratch / "unpacked")
            root.rename(dest)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return dest


def _unpack(archive: Path, into: Path) -> Path:
    """Extract a server archive (one top folder of plain files) and return that folder; links,
    devices and paths out of `into` are refused, whatever the Python version's tarfile does."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for member in members:
            parts = Path(member.name).parts
            if not (member.isfile() or member.isdir()) or member.name.startswith("/") or ".." in parts:
                raise ValueError(f"{archive}: refusing archive member {member.name!r}")
        tops = {Path(m.name).parts[0] for m in members}
        if len(tops) != 1:
            raise ValueError(f"{archive}: expected one top folder, found {sorted(tops)}")
        # Checked above; the "data" filter (Python >= 3.11.4) also drops modes such as setuid.
        safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(into, members=members, **safe)
    return into / tops.pop()


class Workers(_Resource):
    def list(self) -> builtins.list[Json]:
        return list(self._c.json("GET", "/v1/workers")["data"])


# Sent as JSON null by `Projects.update` to lift a quota or remove the default webhook.
UNSET: Any = object()


class Projects(_Resource):
    """Projects (admin scope). An admin of the project "default" administers every project; any
    other admin token its own project only. `project` is an id (proj-...) or a name."""

    def create(
        self,
        name: str,
        *,
        max_queued_jobs: int | None = None,
        max_running_jobs: int | None = None,
        webhook_url: str | None = None,
        slurm_account: str | None = None,
    ) -> Json:
        """Create a project; the answer's `webhook_secret` is shown this once."""
        body: Json = {"name": name}
        for key, value in (
            ("max_queued_jobs", max_queued_jobs),
            ("max_running_jobs", max_running_jobs),
            ("webhook_url", webhook_url),
            ("slurm_account", slurm_account),
        ):
            if value is not None:
                body[key] = value
        result: Json = self._c.json("POST", "/v1/projects", json=body)
        return result

    def list(self, limit: int = 100) -> Iterator[Json]:
        return self._c.paginate("/v1/projects", page_size=limit)

    def get(self, project: str) -> Json:
        result: Json = self._c.json("GET", f"/v1/projects/{segment(project)}")
        return result

    def update(
        self,
        project: str,
        *,
        max_queued_jobs: int | None = UNSET,
        max_running_jobs: int | None = UNSET,
        webhook_url: str | None = UNSET,
        slurm_account: str | None = UNSET,
    ) -> Json:
        """Change only the fields given; `None` lifts a quota, removes the default webhook, or
        returns the project's Slurm jobs to the worker's default account."""
        fields = {
            "max_queued_jobs": max_queued_jobs,
            "max_running_jobs": max_running_jobs,
            "webhook_url": webhook_url,
            "slurm_account": slurm_account,
        }
        body = {key: value for key, value in fields.items() if value is not UNSET}
        result: Json = self._c.json("PATCH", f"/v1/projects/{segment(project)}", json=body)
        return result

    def rotate_webhook_secret(self, project: str) -> Json:
        """A new webhook secret, in the answer's `webhook_secret` (shown this once)."""
        result: Json = self._c.json("POST", f"/v1/projects/{segment(project)}/rotate-webhook-secret")
        return result


class Tokens(_Resource):
    """API tokens (admin scope); the plain token is in `create`'s answer only."""

    def create(
        self,
        *,
        project: str | None = None,
        name: str = "",
        scopes: Sequence[str] = ("read", "write"),
        rate_limit_per_minute: int | None = None,
        expires_at: datetime | str | None = None,
    ) -> Json:
        """A new token in `project` (default: the caller's); `expires_at` timezone-aware."""
        body: Json = {"name": name, "scopes": builtins.list(scopes)}
        if project is not None:
            body["project"] = project
        if rate_limit_per_minute is not None:
            body["rate_limit_per_minute"] = rate_limit_per_minute
        if expires_at is not None:
            body["expires_at"] = expires_at.isoformat() if isinstance(expires_at, datetime) else expires_at
        result: Json = self._c.json("POST", "/v1/tokens", json=body)
        return result

    def list(self, project: str | None = None, limit: int = 100) -> Iterator[Json]:
        """Tokens (revoked ones too) of `project`, or of every project the caller administers."""
        return self._c.paginate("/v1/tokens", {"project": project}, page_size=limit)

    def get(self, token_id: str) -> Json:
        result: Json = self._c.json("GET", f"/v1/tokens/{segment(token_id)}")
        return result

    def revoke(self, token_id: str) -> Json:
        result: Json = self._c.json("POST", f"/v1/tokens/{segment(token_id)}/revoke")
        return result
