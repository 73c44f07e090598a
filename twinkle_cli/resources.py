"""`twinkle-jobs jobs|files|checkpoints ...`: the API from a terminal or a CI pipeline.

Every command takes `--url`/`--token` (or TWINKLE_URL/TWINKLE_TOKEN) and `--output json` for
scripts. `jobs submit --wait` (and `jobs wait`, for a job submitted earlier) exits 0 only when the
job succeeds, so a CI step fails with the job: 1 when it failed (or the API refused a request), 2
when it was cancelled, 3 when `--timeout` passed first (the job goes on).
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click
import httpx
import yaml
from pydantic import ValidationError

from jobcore.jobs.events import EVENT_TYPES
from jobcore.jobs.states import JobStatus
from twinkle_cli.job_view import describe_job, job_table, progress_text, sample_lines
from twinkle_client import APIError, InvalidId, TwinkleClient
from twinkle_client.client import Jobs
from twinkle_core.spec import merge_spec

EXIT_FAILED, EXIT_CANCELLED, EXIT_TIMEOUT = 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C: the shell's code for SIGINT (128 + 2)

OUTPUT = click.option(
    "--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True
)


def _client(ctx: click.Context) -> TwinkleClient:
    conn = ctx.find_object(Connection)
    assert conn is not None, "resource groups store the connection"
    return TwinkleClient(conn.url, conn.token)


class Connection:
    def __init__(self, url: str, token: str | None) -> None:
        self.url = url
        self.token = token


def _group(f: Any) -> Any:
    """A resource group carrying the server URL and token options (also from the environment)."""

    @click.option(
        "--url", envvar="TWINKLE_URL", default="http://127.0.0.1:8000", show_default=True, show_envvar=True
    )
    @click.option("--token", envvar="TWINKLE_TOKEN", default=None, show_envvar=True, help="API token")
    @click.pass_context
    def group(ctx: click.Context, url: str, token: str | None) -> None:
        ctx.obj = Connection(url, token)

    group.__doc__ = f.__doc__
    group.__name__ = f.__name__
    return click.group(name=f.__name__)(group)


def _emit(obj: Any, output: str, text_lines: Iterable[str]) -> None:
    if output == "json":
        click.echo(json.dumps(obj, indent=2, default=str))
    else:
        for line in text_lines:
            click.echo(line)


# A job file's top-level keys besides `spec`: the job body's fields, the keywords that
# `client.jobs.create` takes (but the request's idempotency key).
JOB_BODY_KEYS = tuple(
    name
    for name, parameter in inspect.signature(Jobs.create).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name != "idempotency_key"
)


def shown(path: Path) -> Path:
    """A job file as messages name it: `-` is `<stdin>`."""
    return Path("<stdin>") if str(path) == "-" else path


def load_job_file(path: Path, overrides: Iterable[str] = ()) -> dict[str, Any]:
    """A YAML or JSON file holding either a job body (with `spec`) or a bare JobSpec, as a job
    body, with `--set` overrides merged into its spec (an override wins over the file). `-` is
    standard input (YAML, which takes JSON too), for a job that a pipeline's step writes out."""
    stdin = str(path) == "-"
    path = shown(path)
    try:
        text = sys.stdin.buffer.read().decode("utf-8") if stdin else path.read_text(encoding="utf-8")
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except UnicodeDecodeError as exc:
        raise click.BadParameter(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})", param_hint="-f"
        ) from exc
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        kind = "JSON" if path.suffix == ".json" else "YAML (or JSON)"
        raise click.BadParameter(f"{path}: not valid {kind}: {exc}", param_hint="-f") from exc
    if not isinstance(raw, dict):
        raise click.BadParameter(f"{path}: expected a mapping at the top level", param_hint="-f")
    body = raw if "spec" in raw else {"spec": raw}
    if not isinstance(body["spec"], dict):
        raise click.BadParameter(f"{path}: `spec` must be a mapping", param_hint="-f")
    unknown = sorted(set(body) - {"spec", *JOB_BODY_KEYS})
    if unknown:
        meant = difflib.get_close_matches(unknown[0], JOB_BODY_KEYS, n=1)
        hint = (
            f" (did you mean '{meant[0]}'?)"
            if meant
            else f"; a job file holds spec, {', '.join(JOB_BODY_KEYS)}"
        )
        raise click.BadParameter(f"{path}: unknown top-level key '{unknown[0]}'{hint}", param_hint="-f")
    body["spec"] = merge_spec(body["spec"], parse_overrides(overrides))
    return body


class StepProgress:
    """A progress line per step event while following, with the ETA from the steps' own times."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None

    def line(self, event: dict[str, Any]) -> str | None:
        data = event.get("data") or {}
        step, total, when = data.get("step"), data.get("total_steps"), data.get("time")
        if event.get("type") != "metrics" or not isinstance(step, int) or "loss" not in data:
            return None  # eval results and messages have no step/total to show
        eta = None
        if isinstance(when, int | float):
            if self.first is None or step < self.first[0]:  # the first step seen, or a resume
                self.first = (step, float(when))
            elif total and step > self.first[0]:
                pace = (when - self.first[1]) / (step - self.first[0])
                eta = max(0.0, pace * (total - step))
        percent = round(min(100.0, 100.0 * step / total), 2) if total else None
        progress = {"step": step, "total_steps": total, "percent": percent, "loss": data.get("loss")}
        return _progress_line({"status": "running", "progress": {**progress, "eta_seconds": eta}})


def _progress_line(job: dict[str, Any]) -> str:
    return f"{job['status']:<10} {progress_text(job.get('progress') or {})}"


def handle_api_errors(f: Any) -> Any:
    import functools

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except (APIError, InvalidId) as exc:
            raise click.ClickException(str(exc)) from exc
        except BrokenPipeError:
            # The reader went away (`| head`): nothing more to say. stdout goes to /dev/null so
            # that the interpreter's last flush at exit does not fail on the closed pipe again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        except (httpx.TransportError, ConnectionError) as exc:
            raise click.ClickException(f"cannot reach the server at {_url_of(args)}: {exc}") from exc

    return wrapper


def _url_of(args: tuple[Any, ...]) -> str:
    """The server URL of the command's context (the first argument of every command here)."""
    ctx = args[0] if args and isinstance(args[0], click.Context) else click.get_current_context(silent=True)
    conn = ctx.find_object(Connection) if ctx is not None else None
    return conn.url if conn is not None else "?"


@_group
def jobs() -> None:
    """Submit, watch and control training jobs."""


SPEC_OVERRIDES = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Spec override, e.g. training.max_steps=100 (repeatable)",
)


JOB_FILE = click.option(
    "-f",
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path, allow_dash=True),
    required=True,
    help="The job file (YAML, or JSON; `-`: standard input): a job body with `spec`, or a bare spec",
)


@jobs.command("validate")
@JOB_FILE
@SPEC_OVERRIDES
@OUTPUT
def jobs_validate(path: Path, overrides: tuple[str, ...], output: str) -> None:
    """Check a job file locally without submitting it (the job body as the API checks it, the
    database and file checks aside); prints the resolved spec."""
    from server.errors import validation_error_of
    from server.jobs.schemas import JobCreate

    body = load_job_file(path, overrides)
    try:
        spec = JobCreate.model_validate(body).spec
    except ValidationError as exc:
        for err in exc.errors():
            click.echo(validation_error_of(err)[1], err=True)
        sys.exit(1)
    _emit(
        spec.model_dump(mode="json"),
        output,
        [f"{shown(path)}: valid", yaml.safe_dump(spec.model_dump(mode="json"))],
    )


@jobs.command("submit")
@JOB_FILE
@SPEC_OVERRIDES
@click.option("--name", default=None, help="The job's name (over the file's)")
@click.option("--wait", is_flag=True, help="Wait for the end; exit non-zero unless it succeeded")
@click.option("--follow", is_flag=True, help="Print events as they happen (implies --wait)")
@click.option("--timeout", type=float, default=None, help="Stop waiting after this many seconds (exit 3)")
@OUTPUT
@click.pass_context
@handle_api_errors
def jobs_submit(
    ctx: click.Context,
    path: Path,
    overrides: tuple[str, ...],
    name: str | None,
    wait: bool,
    follow: bool,
    timeout: float | None,
    output: str,
) -> None:
    """Submit a job from a YAML/JSON file, with `--set` overrides merged into its spec.

    A dataset named by a relative path that exists here (`data.train_file: train.jsonl`, relative
    to the current directory) is uploaded first and named by its file id."""
    body = load_job_file(path, overrides)
    if name:
        body["name"] = name
    client = _client(ctx)
    upload_local_datasets(client, body["spec"])
    job = client.jobs.create(**body)
    if not (wait or follow):
        _emit_new_job(job, output)
        return
    if output == "text":
        click.echo(f"submitted {job['id']}")
    _watch_to_the_end(client, job, follow, timeout, output)


def _emit_new_job(job: dict[str, Any], output: str) -> None:
    """A job just made (submit, clone): stdout holds its id alone, for JOB=$(twinkle-jobs ...);
    the rest is for a person, on stderr."""
    _emit(job, output, [job["id"]])
    if output == "text":
        hint = f"twinkle-jobs jobs wait {job['id']} --follow"
        click.echo(f"{job['status']}; wait for it with: {hint}", err=True)


@jobs.command("wait")
@click.argument("job_id")
@click.option("--follow", is_flag=True, help="Print events as they happen")
@click.option("--timeout", type=float, default=None, help="Stop waiting after this many seconds (exit 3)")
@OUTPUT
@click.pass_context
@handle_api_errors
def jobs_wait(ctx: click.Context, job_id: str, follow: bool, timeout: float | None, output: str) -> None:
    """Wait for a submitted (or resumed) job's end; exits as `submit --wait` does."""
    client = _client(ctx)
    _watch_to_the_end(client, client.jobs.get(job_id), follow, timeout, output)


def _watch_to_the_end(
    client: TwinkleClient, job: dict[str, Any], follow: bool, timeout: float | None, output: str
) -> None:
    """Wait (or follow) until the job ends or `timeout` passes, then exit as the job ended. A
    Ctrl-C stops the watching only: exit 130, saying that the job goes on."""
    try:
        if follow:
            _follow(client, job["id"], timeout, output)
            job = client.jobs.get(job["id"])
        else:
            job = _wait(client, job, timeout, output)
    except KeyboardInterrupt:
        click.echo(
            f"\nstopped watching; job {job['id']} goes on (stop it: twinkle-jobs jobs cancel {job['id']})",
            err=True,
        )
        sys.exit(EXIT_INTERRUPTED)
    _finish(job, output, timeout)


DATASET_FIELDS = ("train_file", "validation_file")


def upload_local_datasets(client: TwinkleClient, spec: dict[str, Any]) -> None:
    """Upload each dataset of `spec` that is a relative path to a file here, and put its file id
    in its place. The server reads only absolute paths (under its allowed roots), uploaded file
    ids and hub ids, so a relative path can only mean a file on this machine; an absolute one is
    left for the server, which may well see that path itself."""
    data = spec.get("data")
    if not isinstance(data, dict):
        return
    ids: dict[Path, str] = {}  # one upload for a file named twice
    for field in DATASET_FIELDS:
        value = data.get(field)
        if not isinstance(value, str) or "://" in value or Path(value).is_absolute():
            continue
        local = Path(value)
        if not local.is_file():
            continue  # not a local file: the server's 422 names the field
        key = local.resolve()
        if key not in ids:
            uploaded, stored = client.files.upload_once(local)
            ids[key] = uploaded["id"]
            if stored:
                click.echo(f"uploaded {value} as {ids[key]} (spec.data.{field})", err=True)
            else:
                click.echo(f"{value} is {ids[key]}, uploaded earlier (spec.data.{field})", err=True)
        data[field] = ids[key]


def _follow(client: TwinkleClient, job_id: str, timeout: float | None, output: str) -> None:
    """Every event on stdout, a progress line per step on stderr; returns at the end or the timeout."""
    progress = StepProgress()
    try:
        for event in client.jobs.follow(job_id, timeout=timeout):
            if output != "text":
                continue
            click.echo(f"  [{event.get('type', '?'):>10}] {event.get('message', '')}")
            for sample in sample_lines(event):
                click.echo(sample)
            line = progress.line(event)
            if line:
                click.echo(line, err=True)
    except TimeoutError:
        pass  # _finish reports the job as it is now


def _wait(client: TwinkleClient, job: dict[str, Any], timeout: float | None, output: str) -> dict[str, Any]:
    """Poll the job until it ends or `timeout` passes; returns it as last read."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last = ""
    tty = sys.stderr.isatty()
    while not job["terminal"]:  # the server says when a run has ended
        if deadline is not None and time.monotonic() > deadline:
            break
        line = _progress_line(job)
        if job["status"] == "paused":  # ends only once resumed: say so, or the wait looks stuck
            line += f"  (waiting for a resume: twinkle-jobs jobs resume {job['id']})"
        if output == "text" and line != last:
            click.echo("\r" + line if tty else line, nl=not tty, err=True)
        last = line
        time.sleep(1.0)
        job = _read_through_restarts(client, job, deadline)
    if output == "text" and tty:
        click.echo("", err=True)
    return job


# While a wait cannot reach the server (a restart, a deploy), the pause between two tries.
UNREACHABLE_RETRY_SECONDS = 5.0


def _read_through_restarts(
    client: TwinkleClient, job: dict[str, Any], deadline: float | None
) -> dict[str, Any]:
    """The job read again. A server that cannot be reached is tried again until it answers or
    the deadline passes (then the job as last read), so that a wait outlives a server restart as
    `--follow` does, instead of ending a pipeline's step as if the job had failed."""
    told = False
    while True:
        try:
            return client.jobs.get(job["id"])
        except (httpx.TransportError, ConnectionError) as exc:
            if deadline is not None and time.monotonic() > deadline:
                return job
            if not told:
                click.echo(f"cannot reach the server ({exc}); trying again until it answers", err=True)
                told = True
            time.sleep(UNREACHABLE_RETRY_SECONDS)


def _finish(job: dict[str, Any], output: str, timeout: float | None = None) -> None:
    _emit(job, output, [_progress_line(job)])
    if job["status"] == "succeeded":
        return
    if not job["terminal"]:
        click.echo(f"job {job['id']} is still {job['status']} after the {timeout} s timeout", err=True)
        sys.exit(EXIT_TIMEOUT)
    error = job.get("error") or {}
    reason = error.get("message") or f"job ended {job['status']}"
    click.echo(f"job {job['id']} {job['status']}: {reason}", err=True)
    sys.exit(EXIT_FAILED if job["status"] == "failed" else EXIT_CANCELLED)


@jobs.command("list")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([status.value for status in JobStatus]),
    help="Only this status (repeatable)",
)
@click.option("--name", default=None, help="Only jobs with this exact name")
@click.option("--metadata", "metadata", multiple=True, help="key:value the job's metadata holds (repeatable)")
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="At most this many jobs"
)
@click.option("--spec", "with_spec", is_flag=True, help="Include each job's spec (JSON output; null without)")
@OUTPUT
@click.pass_context
@handle_api_errors
def jobs_list(
    ctx: click.Context,
    statuses: tuple[str, ...],
    name: str | None,
    metadata: tuple[str, ...],
    limit: int,
    with_spec: bool,
    output: str,
) -> None:
    """List jobs, newest first."""
    pairs = {}
    for item in metadata:
        key, sep, value = item.partition(":")
        if not sep:
            raise click.BadParameter(f"expected KEY:VALUE, got {item!r}", param_hint="--metadata")
        pairs[key] = value
    items = []
    for job in _client(ctx).jobs.list(
        status=list(statuses), name=name, metadata=pairs, limit=limit, with_spec=with_spec
    ):
        items.append(job)
        if len(items) >= limit:
            break
    _emit(items, output, job_table(items))


def _job_action(action: str) -> Any:
    @click.argument("job_id")
    @OUTPUT
    @click.pass_context
    @handle_api_errors
    def command(ctx: click.Context, job_id: str, output: str) -> None:
        job = getattr(_client(ctx).jobs, action)(job_id)
        _emit(job, output, [f"{job['id']} {job['status']}"])

    command.__doc__ = f"{action.capitalize()} a job."
    return command


@jobs.command("get")
@click.argument("job_id")
@OUTPUT
@click.pass_context
@handle_api_errors
def jobs_get(ctx: click.Context, job_id: str, output: str) -> None:
    """Show a job: what it trains, its progress and checkpoints, the model name it answers to once
    it succeeded, its error, and the actions it allows now."""
    job = _client(ctx).jobs.get(job_id)
    _emit(job, output, describe_job(job))


def _interactive() -> bool:
    return sys.stdin.isatty()


def _delete_command(resource: str, what: str, doc: str) -> Any:
    """`<resource> delete ID [--yes]`. Deleting cannot be undone: it asks on a terminal, and
    without one (a script) refuses unless given --yes, rather than hang on a prompt."""

    @click.argument("item_id", metavar=f"{resource.upper().rstrip('S')}_ID")
    @click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (scripts)")
    @OUTPUT
    @click.pass_context
    @handle_api_errors
    def command(ctx: click.Context, item_id: str, yes: bool, output: str) -> None:
        target = what.format(id=item_id)
        if not yes:
            if not _interactive():
                raise click.UsageError(f"deleting {target} cannot be undone: pass --yes to skip the prompt")
            click.confirm(f"Delete {target}? This cannot be undone", abort=True, err=True)
        deleted = getattr(_client(ctx), resource).delete(item_id)
        _emit(deleted, output, [f"deleted {deleted['id']}"])

    command.__doc__ = doc
    return command


jobs.command("delete")(
    _delete_command(
        "jobs", "job {id} with its checkpoints, logs and events", "Delete an ended job and all it wrote."
    )
)
jobs.command("cancel")(_job_action("cancel"))
jobs.command("pause")(_job_action("pause"))


@jobs.command("resume")
@click.argument("job_id")
@click.option("--checkpoint", default=None, help="Checkpoint id to resume from (default: the latest)")
@OUTPUT
@click.pass_context
@handle_api_errors
def jobs_resume(ctx: click.Context, job_id: str, checkpoint: str | None, output: str) -> None:
    """Resume a paused, failed or cancelled job."""
    job = _client(ctx).jobs.resume(job_id, checkpoint)
    _emit(job, output, [f"{job['id']} {job['status']}"])


@jobs.command("clone")
@click.argument("job_id")
@SPEC_OVERRIDES
@click.option("--name", default=None, help="The new job's name")
@OUTPUT
@click.pass_context
@handle_api_errors
def jobs_clone(
    ctx: click.Context, job_id: str, overrides: tuple[str, ...], name: str | None, output: str
) -> None:
    """Submit a copy of a job, with spec overrides merged in; prints the new job's id."""
    _emit_new_job(_client(ctx).jobs.clone(job_id, parse_overrides(overrides), name), output)


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """`a.b.c=value` pairs into a nested dict; values are parsed as YAML (3, 1e-4, true, [q, v]).
    A key may start with `spec.`, as the errors name a field (`spec.training.max_steps`)."""

    def bad(message: str) -> click.BadParameter:
        return click.BadParameter(message, param_hint="--set")

    result: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        parts = key.removeprefix("spec.").split(".")
        if not sep or not all(parts):
            raise bad(f"expected KEY=VALUE with KEY like training.max_steps, got {pair!r}")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise bad(f"{key}: {text!r} is not a YAML value ({exc})") from exc
        node = result
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # `a=1 a.b=2`: a is a value and a section at once
                raise bad(f"{'.'.join(parts[: depth + 1])} is set to a value and used as a section")
            node = child
        node[parts[-1]] = value
    return result


@jobs.command("logs")
@click.argument("job_id")
@click.option("--lines", "-n", default=200, show_default=True, help="Lines from the end of each log")
@click.option("--attempt", type=int, default=None, help="Which attempt (default: the latest)")
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing the job's log as it is written, until the job ends"
)
@click.option("--timeout", type=float, default=None, help="With --follow: stop after this many s (exit 3)")
@click.option("--rank", type=int, default=None, help="One rank's own log files (a global rank)")
@click.option("--all", "all_files", is_flag=True, help="Every log file: the attempt's and each rank's")
@OUTPUT
@click.pass_context
@handle_api_errors
def jobs_logs(
    ctx: click.Context,
    job_id: str,
    lines: int,
    attempt: int | None,
    follow: bool,
    timeout: float | None,
    rank: int | None,
    all_files: bool,
    output: str,
) -> None:
    """Print the tail of the job's log (every rank's lines, as the launcher tees them), or follow
    it. Each rank's own files hold the same lines again: `--rank R` shows one rank's, `--all` all."""
    if follow:
        if attempt is not None or rank is not None or all_files:
            raise click.UsageError("--follow follows the latest attempt's log: no --attempt, --rank or --all")
        _follow_logs(_client(ctx), job_id, lines, timeout, output)
        return
    if rank is not None and all_files:
        raise click.UsageError("--rank shows one rank's files, --all every file: give one")
    client = _client(ctx)
    logs = client.jobs.logs(job_id, lines, attempt, rank=rank)
    if rank is None and not all_files:
        logs["files"] = [log for log in logs["files"] if is_combined_log(log["name"])]
    if not logs["files"]:
        _say_why_there_is_no_log(client.jobs.get(job_id), attempt, rank)
    text: list[str] = []
    for log in logs["files"]:
        text.append(f"==> {log['name']}{' (tail)' if log.get('truncated') else ''} <==")
        text.extend(log["lines"])
    _emit(logs, output, text)


def _say_why_there_is_no_log(job: dict[str, Any], attempt: int | None, rank: int | None) -> None:
    """An empty answer, explained: nothing has run yet (exit 0), or the attempt or rank asked for
    has no log (exit 1), rather than nothing printed at all."""
    attempts = job["attempt"]
    if attempt is not None and not 1 <= attempt <= attempts:
        runs = f"its attempts are 1 to {attempts}" if attempts else "it has not run yet"
        raise click.ClickException(f"job {job['id']} has no attempt {attempt}: {runs}")
    if not attempts:
        click.echo(f"no log yet: job {job['id']} is {job['status']} and has not run", err=True)
        return
    which = f"attempt {attempt or attempts}"
    if rank is not None:
        raise click.ClickException(f"no log files of rank {rank} in {which} of job {job['id']}")
    click.echo(f"no log files in {which} of job {job['id']} (yet)", err=True)


def is_combined_log(name: str) -> bool:
    """Whether a log file (by its listed name) holds every rank's lines: the attempt's log, or a
    node's torchrun log on a multi-node job, rather than one rank's own stdout or stderr."""
    return "-ranks/" not in name or name.endswith("/torchrun.log")


def _follow_logs(client: TwinkleClient, job_id: str, lines: int, timeout: float | None, output: str) -> None:
    """Each line as it is written (`-o json`: `{"file", "line"}` per line), a header when a new
    attempt's log begins; exits 0 once the job has ended, 3 at the timeout."""
    shown: str | None = None
    try:
        for name, line in client.jobs.follow_logs(job_id, lines=lines, timeout=timeout):
            if output == "json":
                click.echo(json.dumps({"file": name, "line": line}))
                continue
            if name != shown:
                click.echo(f"==> {name} <==")
                shown = name
            click.echo(line)
    except TimeoutError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_TIMEOUT)


@jobs.command("artifacts")
@click.argument("job_id")
@click.option(
    "--download",
    "name",
    type=click.Choice(["tensorboard", "mlflow", "wandb"]),
    default=None,
    help="Save this tracker's output as a tar.gz instead of listing",
)
@click.option("--dest", type=click.Path(path_type=Path), default=None, help="Archive path [JOB-NAME.tar.gz]")
@OUTPUT
@click.pass_context
@handle_api_errors
def jobs_artifacts(ctx: click.Context, job_id: str, name: str | None, dest: Path | None, output: str) -> None:
    """List what the job's experiment trackers wrote, or download one (`--download tensorboard`)."""
    client = _client(ctx)
    if name is None:
        items = client.jobs.artifacts(job_id)
        _emit(items, output, [f"{a['name']}  {a['files']} files  {a['size_bytes']} bytes" for a in items])
        if not items and output == "text":
            why = "trackers are chosen by spec.training.report_to"
            click.echo(f"{job_id} has no tracker output ({why})", err=True)
        return
    target = _archive_path(dest, Path(f"{job_id}-{name}.tar.gz"))
    path = _written(lambda: client.jobs.download_artifact(job_id, name, target), target)
    _emit(
        {"job_id": job_id, "name": name, "path": str(path), "bytes": path.stat().st_size}, output, [str(path)]
    )


@jobs.command("events")
@click.argument("job_id")
@click.option("--follow", is_flag=True, help="Keep printing until the job ends")
@click.option(
    "--timeout", type=float, default=None, help="With --follow: stop after this many seconds (exit 3)"
)
@click.option(
    "--type",
    "types",
    multiple=True,
    type=click.Choice(EVENT_TYPES),
    help="Only events of this type (repeatable)",
)
@OUTPUT
@click.pass_context
@handle_api_errors
def jobs_events(
    ctx: click.Context, job_id: str, follow: bool, timeout: float | None, types: tuple[str, ...], output: str
) -> None:
    """Print a job's events, one per line (`-o json`: one JSON object per line)."""
    client = _client(ctx)
    source = client.jobs.follow(job_id, timeout=timeout) if follow else client.jobs.events(job_id, type=types)
    try:
        for event in source:
            if types and event.get("type") not in types:
                continue
            if output == "json":
                click.echo(json.dumps(event, default=str))
            else:
                click.echo(
                    f"{event.get('created_at', '')}  {event.get('level', ''):<5} {event.get('message', '')}"
                )
                for line in sample_lines(event):
                    click.echo(line)
    except TimeoutError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_TIMEOUT)


@_group
def files() -> None:
    """Upload and list dataset files."""


@files.command("upload")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@OUTPUT
@click.pass_context
@handle_api_errors
def files_upload(ctx: click.Context, path: Path, output: str) -> None:
    """Upload a JSONL/JSON/CSV/Parquet dataset (validated by the server)."""
    info = _client(ctx).files.upload(path)
    _emit(info, output, [f"{info['id']}  {info.get('filename')}  {info.get('bytes')} bytes"])


@files.command("list")
@OUTPUT
@click.pass_context
@handle_api_errors
def files_list(ctx: click.Context, output: str) -> None:
    """List uploaded files."""
    items = list(_client(ctx).files.list())
    _emit(items, output, [f"{f['id']}  {f.get('filename')}  {f.get('bytes')} bytes" for f in items])


files.command("delete")(
    _delete_command("files", "file {id}", "Delete an uploaded file (refused while a running job uses it).")
)


@_group
def checkpoints() -> None:
    """List, download and export checkpoints."""


@checkpoints.command("list")
@click.argument("job_id")
@OUTPUT
@click.pass_context
@handle_api_errors
def checkpoints_list(ctx: click.Context, job_id: str, output: str) -> None:
    """List a job's checkpoints."""
    items = list(_client(ctx).checkpoints.list(job_id))
    lines = [f"{c['id']}  step {c['step']}{'  (best)' if c.get('is_best') else ''}" for c in items]
    _emit(items, output, lines)


def _archive_path(dest: Path | None, default: Path) -> Path:
    """Where a download goes: `--dest`, inside it under the default name when it is a folder."""
    if dest is None:
        return default
    return dest / default.name if dest.is_dir() else dest


def _written(download: Callable[[], Path], target: Path) -> Path:
    """Run a download to `target`, saying in one line why the file could not be written."""
    try:
        return download()
    except OSError as exc:
        raise click.ClickException(f"cannot write {target}: {exc.strerror or exc}") from exc


@checkpoints.command("download")
@click.argument("job_id")
@click.argument("checkpoint_id")
@click.option("--dest", type=click.Path(path_type=Path), default=None, help="Archive path [CKPT_ID.tar]")
@OUTPUT
@click.pass_context
@handle_api_errors
def checkpoints_download(
    ctx: click.Context, job_id: str, checkpoint_id: str, dest: Path | None, output: str
) -> None:
    """Download a checkpoint as a tar archive; prints its path."""
    client = _client(ctx)
    target = _archive_path(dest, Path(f"{checkpoint_id}.tar"))
    path = _written(lambda: client.checkpoints.download(job_id, checkpoint_id, target), target)
    info = {"job_id": job_id, "checkpoint_id": checkpoint_id, "path": str(path), "bytes": path.stat().st_size}
    _emit(info, output, [str(path)])


@checkpoints.command("export")
@click.argument("job_id")
@click.argument("step", type=click.IntRange(min=0))
@click.option(
    "--no-merge", is_flag=True, help="LoRA jobs: the adapter alone instead of merged into the base model"
)
@click.option(
    "--dest",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder to unpack the model into (must not exist) [JOB_ID-step-STEP-KIND]",
)
@click.option("--no-download", is_flag=True, help="Only ask for the export (and wait for it)")
@click.option("--timeout", type=float, default=None, help="Stop waiting after this many seconds (exit 3)")
@OUTPUT
@click.pass_context
@handle_api_errors
def checkpoints_export(
    ctx: click.Context,
    job_id: str,
    step: int,
    no_merge: bool,
    dest: Path | None,
    no_download: bool,
    timeout: float | None,
    output: str,
) -> None:
    """Export a checkpoint as a Hugging Face model folder: wait for the worker, download, unpack.

    Prints the folder, loadable with `AutoModelForCausalLM.from_pretrained` (or, with --no-merge,
    `PeftModel.from_pretrained` on the base model). Exit 1 when the export failed, 3 on --timeout.
    """
    client = _client(ctx)
    export = client.exports.create(job_id, step, merge=False if no_merge else None)
    try:
        export = client.exports.wait(export["id"], timeout=timeout)
    except TimeoutError as exc:
        click.echo(f"{exc}; it goes on: twinkle-jobs checkpoints export {job_id} {step} again", err=True)
        sys.exit(EXIT_TIMEOUT)
    if export["status"] == "failed":
        _emit(export, output, [f"export {export['id']} failed: {export.get('error')}"])
        sys.exit(EXIT_FAILED)
    if not no_download:
        folder = dest or Path(f"{job_id}-step-{step}-{export['kind']}")
        try:
            export["path"] = str(client.exports.download_folder(export["id"], folder))
        except FileExistsError as exc:
            raise click.ClickException(f"{exc}: choose another --dest") from exc
    _emit(export, output, [export.get("path") or export["id"]])
