"""The deployment files say what docs/deploy.md promises, checked without a Docker engine.

docker-compose.yml is read with PyYAML (merge keys resolved), the Dockerfiles with a small parser
of their instructions; the helper scripts that the images run (health check, requirements,
entrypoint) are exercised for real. scripts/check_deploy.sh adds the real compose parser,
hadolint and shellcheck on top.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TWINKLE_SERVICES = ("migrate", "server", "worker", "serving", "beat")


def load_module(name: str, path: Path) -> ModuleType:
    """docker/ is not a package: load its scripts by path, as the images run them."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


healthcheck = load_module("twinkle_docker_healthcheck", ROOT / "docker" / "healthcheck.py")
runtime_requirements = load_module("twinkle_docker_requirements", ROOT / "docker" / "runtime_requirements.py")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = compose["services"]
    return result


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, f"{path}: dangling line continuation"
    return instructions


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    return {name: spec["condition"] for name, spec in service.get("depends_on", {}).items()}


# --- docker-compose.yml ------------------------------------------------------------------------------


def test_the_stack_has_every_service(services: dict[str, Any]) -> None:
    assert set(services) >= {"postgres", "redis", *TWINKLE_SERVICES}


def test_postgres_and_redis_are_healthchecked_and_persistent(services: dict[str, Any]) -> None:
    for name in ("postgres", "redis"):
        assert services[name]["healthcheck"]["test"], name
    assert any(v.endswith(":/var/lib/postgresql/data") for v in services["postgres"]["volumes"])
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])


def test_service_code_starts_only_after_a_successful_migration(services: dict[str, Any]) -> None:
    assert services["migrate"]["command"] == ["twinkle-jobs", "migrate"]
    assert services["migrate"]["restart"] == "no"
    assert depends_on(services["migrate"]) == {"postgres": "service_healthy"}
    for name in ("server", "worker", "beat"):
        assert depends_on(services[name])["migrate"] == "service_completed_successfully", name
        assert depends_on(services[name])["redis"] == "service_healthy", name
    for name in ("server", "worker"):
        assert depends_on(services[name])["postgres"] == "service_healthy", name


def test_worker_reserves_nvidia_gpus(services: dict[str, Any]) -> None:
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert services["worker"]["build"]["dockerfile"] == "docker/worker.Dockerfile"
    # No GPU for the services that never train.
    for name in ("server", "beat", "migrate"):
        assert "deploy" not in services[name], name
        assert services[name]["build"]["dockerfile"] == "docker/server.Dockerfile", name


def test_worker_gpus_are_never_defaulted_to_an_empty_list(services: dict[str, Any]) -> None:
    # worker.gpus.discover_gpus reads an empty TWINKLE_WORKER_GPUS as "no GPUs": unset must stay unset.
    environment = services["worker"].get("environment", {})
    assert "TWINKLE_WORKER_GPUS" not in environment or environment["TWINKLE_WORKER_GPUS"]


GPU_MACHINE = ("worker", "serving")  # the services that lease GPUs from one pool


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    """A service's `environment`, in either of compose's forms (a mapping, or KEY=VALUE items)."""
    environment = service.get("environment", {})
    if isinstance(environment, list):
        return dict(item.split("=", 1) for item in environment)
    return dict(environment)


def test_worker_and_serving_host_lease_gpus_from_one_pool(services: dict[str, Any]) -> None:
    # GPU leases (jobcore/gpu_leases.py) are shared by the processes of one machine name,
    # TWINKLE_WORKER_HOST, which defaults to the hostname, and every container has its own: unless
    # both are given one name and the same GPUs, the serving host leases a GPU training also uses.
    names = {environment_of(services[name]).get("TWINKLE_WORKER_HOST") for name in GPU_MACHINE}
    assert len(names) == 1 and all(names), names
    every_gpu = [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    for name in GPU_MACHINE:
        assert services[name]["deploy"]["resources"]["reservations"]["devices"] == every_gpu, name
    # Nothing else gets the name: it stands for the worker container's GPUs and PID namespace. A
    # worker takes the WorkerNode rows of its own name for processes it can see and checks their
    # PIDs (worker/reconciler.py, registry.process_is_alive); the serving host registers no such row.
    for name, service in services.items():
        if name not in GPU_MACHINE:
            assert "TWINKLE_WORKER_HOST" not in environment_of(service), name


def test_server_and_workers_share_data_and_checkpoint_volumes(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    mounts = {name: set(services[name]["volumes"]) for name in ("server", "worker", "beat")}
    assert mounts["server"] == mounts["worker"] == mounts["beat"]
    assert {"twinkle-data:/data", "twinkle-checkpoints:/data/jobs"} <= mounts["server"]
    assert {"twinkle-data", "twinkle-checkpoints"} <= set(compose["volumes"])


def test_twinkle_services_read_dotenv_and_use_the_mounted_data_dir(services: dict[str, Any]) -> None:
    for name in TWINKLE_SERVICES:
        assert services[name]["env_file"] == ".env", name
        assert services[name]["environment"]["TWINKLE_DATA_DIR"] == "/data", name
        assert services[name]["init"] is True, name


def test_compose_commands_exist_in_the_cli(services: dict[str, Any]) -> None:
    import click

    from twinkle_cli.main import cli

    for name in TWINKLE_SERVICES:
        argv = services[name]["command"]
        assert argv[0] == "twinkle-jobs", name
        # Parsing raises click.UsageError for an unknown option.
        with cli.make_context("twinkle-jobs", list(argv[1:])) as ctx:
            command = cli.get_command(ctx, argv[1])
            assert isinstance(command, click.Command), f"{name}: no `twinkle-jobs {argv[1]}` command"
            command.make_context(argv[1], list(argv[2:]), parent=ctx)
    # Scaled workers must not each run a beat: the schedule runs in `beat` only.
    assert "--no-beat" in services["worker"]["command"]


def test_beat_schedules_the_reconciler_and_keeps_no_schedule_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `twinkle-jobs beat` runs Celery beat with the workers' app: what it schedules is that app's.
    from celery.beat import Service

    from jobcore.settings import Settings
    from worker.celery_app import RECONCILE_TASK, make_celery

    app = make_celery(Settings(data_dir=tmp_path / "data"))
    assert RECONCILE_TASK in {entry["task"] for entry in app.conf.beat_schedule.values()}
    # The schedule lives in memory: Celery's default would write `celerybeat-schedule` into the
    # working directory (the read-only source tree in the images), and a file per process was
    # never removed. Built and closed as both beats (`celery beat`, a worker's embedded one) build
    # it, from the app's `beat_scheduler`, the scheduler leaves no file anywhere.
    work_dir, temp_dir = tmp_path / "cwd", tmp_path / "tmp"
    work_dir.mkdir()
    temp_dir.mkdir()
    monkeypatch.chdir(work_dir)
    monkeypatch.setattr(tempfile, "tempdir", str(temp_dir))
    scheduler = Service(app, scheduler_cls=app.conf.beat_scheduler).get_scheduler()
    assert RECONCILE_TASK in {entry.task for entry in scheduler.schedule.values()}
    scheduler.close()
    assert list(work_dir.iterdir()) == []
    assert list(temp_dir.iterdir()) == []
    assert not any("beat" in p.name or "schedule" in p.name for p in (tmp_path / "data").rglob("*"))


# --- Dockerfiles ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dockerfile", "base", "check", "command"),
    [
        ("server.Dockerfile", "python:3.11-slim", "server", ["twinkle-jobs", "server", "--host", "0.0.0.0"]),
        ("worker.Dockerfile", "pytorch/pytorch:2.13.0-cuda", "worker", ["twinkle-jobs", "worker"]),
    ],
)
def test_dockerfile_runs_as_non_root_with_a_healthcheck(
    dockerfile: str, base: str, check: str, command: list[str]
) -> None:
    instructions = dockerfile_instructions(ROOT / "docker" / dockerfile)
    args_of = {keyword: args for keyword, args in instructions}  # the last one of each kind wins
    arg_defaults = dict(a.split("=", 1) for k, a in instructions if k == "ARG" and "=" in a)

    def resolve(value: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: arg_defaults[m.group(1)], value)

    from_image = resolve(args_of["FROM"])
    assert from_image.startswith(base) and not from_image.endswith(":latest")
    user, _, group = resolve(args_of["USER"]).partition(":")
    assert user.isdigit() and int(user) != 0 and group != "0"
    # USER comes after every RUN: the image's build steps run as root, its processes never do.
    last_run = max(i for i, (k, _) in enumerate(instructions) if k == "RUN")
    assert [i for i, (k, _) in enumerate(instructions) if k == "USER"][-1] > last_run
    assert f'CMD ["twinkle-healthcheck", "{check}"]' in args_of["HEALTHCHECK"]
    assert json.loads(args_of["ENTRYPOINT"]) == ["twinkle-entrypoint"]
    assert json.loads(args_of["CMD"])[: len(command)] == command


def test_worker_image_keeps_the_base_images_torch() -> None:
    runs = [
        args
        for keyword, args in dockerfile_instructions(ROOT / "docker" / "worker.Dockerfile")
        if keyword == "RUN"
    ]
    assert not any("pip install" in r and "torch==" in r for r in runs)
    assert any("--keep-installed torch" in r for r in runs)
    # A plain install (not -e): the wheel carries everything the service needs, migrations included.
    assert any("pip install --no-cache-dir --no-deps /app" in r for r in runs)


def test_dockerignore_keeps_secrets_and_local_state_out() -> None:
    patterns = (ROOT / ".dockerignore").read_text().split()
    assert {".env", ".git", ".venv", "!.env.example"} <= set(patterns)


def test_env_example_documents_every_setting() -> None:
    from jobcore.settings import Settings

    text = (ROOT / ".env.example").read_text()
    missing = [f"TWINKLE_{f.upper()}" for f in Settings.model_fields if f"TWINKLE_{f.upper()}=" not in text]
    assert not missing, f".env.example lacks {missing}"
    assert "TWINKLE_DATABASE_URL=postgresql+psycopg://" in text
    assert "TWINKLE_BROKER_URL=redis://" in text


# --- docker/runtime_requirements.py ------------------------------------------------------------------


def test_requirements_pin_torch_as_installed_and_keep_the_rest() -> None:
    import tomllib
    from importlib import metadata

    lines = runtime_requirements.runtime_requirements(ROOT / "pyproject.toml", ["torch"])
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch=={metadata.version('torch')}" in lines
    assert [d for d in declared if not d.startswith("torch")] == [
        x for x in lines if not x.startswith("torch")
    ]


def test_requirements_reject_a_package_pyproject_does_not_list(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not-a-dependency"):
        runtime_requirements.runtime_requirements(ROOT / "pyproject.toml", ["not-a-dependency"])
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["surely-not-installed>=1"]\n'
    )
    with pytest.raises(ValueError, match="not installed"):
        runtime_requirements.runtime_requirements(tmp_path / "pyproject.toml", ["surely-not-installed"])


# --- docker/healthcheck.py ---------------------------------------------------------------------------


class _HealthzHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass


@pytest.fixture()
def http_server() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _HealthzHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_server_check_needs_a_200_from_healthz(http_server: str) -> None:
    assert healthcheck.check_server(f"{http_server}/healthz").healthy
    assert not healthcheck.check_server(f"{http_server}/broken").healthy
    server_gone = healthcheck.check_server("http://127.0.0.1:9/healthz", timeout=2)
    assert not server_gone.healthy and "unreachable" in server_gone.reason


@pytest.fixture()
def worker_db(tmp_path: Path) -> str:
    from jobcore.db.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'twinkle.db'}"
    upgrade(url)
    return url


def add_worker_row(url: str, host: str, pid: int, heartbeat_at: datetime) -> None:
    from jobcore.db.models import WorkerNode
    from jobcore.db.session import session_scope

    with session_scope(url) as session:
        session.add(WorkerNode(id=f"w-{pid}-{host}", host=host, pid=pid, heartbeat_at=heartbeat_at))


def test_worker_check_wants_a_live_local_process_with_a_fresh_heartbeat(worker_db: str) -> None:
    now = datetime.now(UTC)
    assert not healthcheck.check_worker(worker_db, "node-a", 30.0, now=now).healthy  # not registered yet
    add_worker_row(worker_db, "node-a", os.getpid(), now - timedelta(seconds=5))
    assert healthcheck.check_worker(worker_db, "node-a", 30.0, now=now).healthy
    stale = healthcheck.check_worker(worker_db, "node-a", 30.0, now=now + timedelta(seconds=60))
    assert not stale.healthy and "heartbeat" in stale.reason
    # Another host's row does not make this container healthy.
    assert not healthcheck.check_worker(worker_db, "node-b", 30.0, now=now).healthy


def test_worker_check_ignores_a_row_whose_process_is_gone(worker_db: str) -> None:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    now = datetime.now(UTC)
    add_worker_row(worker_db, "node-a", finished.pid, now)
    verdict = healthcheck.check_worker(worker_db, "node-a", 30.0, now=now)
    assert not verdict.healthy and "no live worker process" in verdict.reason


def test_worker_check_reports_an_unreachable_database(tmp_path: Path) -> None:
    verdict = healthcheck.check_worker(f"sqlite:///{tmp_path}/missing/dir/db.sqlite", "node-a", 30.0)
    assert not verdict.healthy and "database unreachable" in verdict.reason


def test_healthcheck_cli_exit_codes(http_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWINKLE_HEALTHCHECK_URL", f"{http_server}/healthz")
    assert healthcheck.main(["server"]) == 0
    monkeypatch.setenv("TWINKLE_HEALTHCHECK_URL", f"{http_server}/nope")
    assert healthcheck.main(["server"]) == 1
    assert healthcheck.main(["bogus"]) == 2


# --- docker/entrypoint.sh --------------------------------------------------------------------------


def run_entrypoint(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TWINKLE_")}
    return subprocess.run(
        ["sh", str(ROOT / "docker" / "entrypoint.sh"), "sh", "-c", "echo ran"],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_entrypoint_runs_the_command_when_the_data_dir_is_writable(tmp_path: Path) -> None:
    result = run_entrypoint(TWINKLE_DATA_DIR=str(tmp_path / "data"), TWINKLE_BOOTSTRAP_TOKEN="s3cret")
    assert result.returncode == 0 and result.stdout.strip() == "ran", result.stderr
    assert (tmp_path / "data").is_dir()


def test_entrypoint_refuses_an_unusable_data_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_entrypoint(TWINKLE_DATA_DIR=str(blocker / "data"))
    assert result.returncode == 1 and "ran" not in result.stdout
    assert "not writable" in result.stderr


def test_entrypoint_refuses_the_placeholder_secrets_of_env_example(tmp_path: Path) -> None:
    example = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line.startswith("TWINKLE_") and "=" in line
    )
    for name in ("TWINKLE_BOOTSTRAP_TOKEN", "TWINKLE_DATABASE_URL"):
        result = run_entrypoint(TWINKLE_DATA_DIR=str(tmp_path), **{name: example[name]})
        assert result.returncode == 1 and "ran" not in result.stdout, name
        assert "change-me" in result.stderr


def test_requirements_add_the_named_extras_and_refuse_an_unknown_one() -> None:
    import tomllib

    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    lines = runtime_requirements.runtime_requirements(ROOT / "pyproject.toml", ["torch"], ["trackers"])
    assert set(optional["trackers"]) <= set(lines)
    with pytest.raises(ValueError, match="--extra nope: pyproject defines no such extra"):
        runtime_requirements.runtime_requirements(ROOT / "pyproject.toml", ["torch"], ["nope"])


@pytest.mark.parametrize("image", ["server", "worker"])
def test_images_install_the_trackers_extra(image: str) -> None:
    text = (ROOT / "docker" / f"{image}.Dockerfile").read_text()
    assert "runtime_requirements.py /tmp/build/pyproject.toml --keep-installed torch --extra trackers" in text
