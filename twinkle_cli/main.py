"""`twinkle-jobs`: run and administer the service.

Service commands: `server`, `worker`, `up` (server + worker on the embedded defaults), `demo` and
`migrate`. Admin commands (`tokens ...`) talk to the database directly, so they work before any
token exists.
"""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, Any

import click

from jobcore.settings import get_settings, redacted_url

if TYPE_CHECKING:
    from twinkle_cli.stack import LocalStack


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="twinkle-jobs", prog_name="twinkle-jobs")
def cli() -> None:
    """Twinkle Jobs: a self-hosted fine-tuning service."""


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface the API server listens on")
@click.option("--port", default=8000, show_default=True, type=int, help="Port of the API server")
@click.option("--workers", "num_workers", default=1, show_default=True, type=int, help="uvicorn processes")
def server(host: str, port: int, num_workers: int) -> None:
    """Run the API server (applies migrations at start)."""
    import uvicorn

    uvicorn.run("server.app:create_app", factory=True, host=host, port=port, workers=num_workers)


@cli.command()
@click.option("--concurrency", type=int, default=None, help="Jobs at once (default: by GPUs/slots)")
@click.option("--beat/--no-beat", default=True, show_default=True, help="Also run the reconciler schedule")
@click.option("--banner/--no-banner", default=True, show_default=True, help="Print Celery's start-up banner")
def worker(concurrency: int | None, beat: bool, banner: bool) -> None:
    """Run a worker: claims queued jobs and supervises their torchrun processes."""
    from worker.agent import WorkerNameInUse
    from worker.main import run_worker

    try:
        run_worker(get_settings(), concurrency=concurrency, beat=beat, banner=banner)
    except WorkerNameInUse as exc:
        raise click.ClickException(str(exc)) from None


@cli.command()
def beat() -> None:
    """Run only the reconciler schedule (Celery beat); one per deployment next to `worker --no-beat`."""
    import logging

    from worker.celery_app import make_celery, quiet_routine_task_logs

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_routine_task_logs()
    make_celery(get_settings()).start(["beat", "--loglevel=INFO"])


@cli.command()
def migrate() -> None:
    """Apply the database migrations (alembic upgrade head)."""
    from jobcore.db.migrate import upgrade

    settings = get_settings()
    upgrade(settings.resolved_database_url)
    click.echo(f"database at head: {redacted_url(settings.resolved_database_url)}")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface the API server listens on")
@click.option("--port", default=8000, show_default=True, type=int, help="Port of the API server")
def up(host: str, port: int) -> None:
    """Run the server, a worker and a serving host together on the configured (default: embedded)
    database and broker."""
    from twinkle_cli.stack import LocalStack, StackError

    stack = LocalStack(get_settings(), host=host, port=port)
    _sigterm_as_interrupt()
    try:
        stack.start()
        ready = stack.wait_ready()
        if stack.exited() is None:
            _print_up_banner(stack, ready)
        code = stack.wait()
        click.echo(f"the {stack.exited()} process exited (code {code}); stopping the others", err=True)
    except StackError as exc:
        click.echo(f"Error: {exc}", err=True)
        code = 1
    except KeyboardInterrupt:
        code = 0  # Ctrl-C or SIGTERM: the stop that was asked for, not a failure
    finally:
        # A second signal must not cut the stop short and leave a child running.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stack.stop()
    sys.exit(code)


@cli.command()
@click.option("--url", default=None, help="Use a running server instead of starting one")
@click.option("--token", envvar="TWINKLE_TOKEN", default=None, show_envvar=True, help="API token for --url")
@click.option("--steps", default=8, show_default=True, type=int)
@click.option("--nproc", default=2, show_default=True, type=int, help="Training processes (torchrun)")
@click.option("--timeout", default=600.0, show_default=True, type=float, help="Seconds to wait for the job")
def demo(url: str | None, token: str | None, steps: int, nproc: int, timeout: float) -> None:
    """Fine-tune a tiny local model end to end through the API and print the checkpoint path."""
    from twinkle_cli.demo import run_demo
    from twinkle_cli.stack import LocalStack, StackError, free_port

    settings = get_settings()
    if url:
        if not token:
            raise click.UsageError("--token (or TWINKLE_TOKEN) is required with --url")
        sys.exit(run_demo(url, token, settings, steps, nproc, timeout, own_stack=False))
    stack = LocalStack(settings, port=free_port(), quiet=True)
    _sigterm_as_interrupt()
    click.echo(f"starting a local server and worker (data dir {settings.data_dir}, logs in its logs/)")
    try:
        stack.start()
        code = run_demo(stack.url, stack.token, settings, steps, nproc, timeout, own_stack=True)
    except StackError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        stack.stop()
    sys.exit(code)


def _print_up_banner(stack: LocalStack, ready: dict[str, str | None]) -> None:
    # After the children's start-up output, so that these lines are the last on the screen.
    click.echo(f"\nTwinkle Jobs is up at {stack.url}  (dashboard: {stack.url}/)")
    click.echo(f"API token: {stack.token}")
    click.echo(f"data dir:  {stack.settings.data_dir}   (Ctrl-C stops them all)")
    for part, description in ready.items():
        state = f"ready ({description})" if description else "not registered yet: see its output above"
        click.echo(f"{part + ':':<10} {state}")
    click.echo(f"From a shell: export TWINKLE_URL={stack.url} TWINKLE_TOKEN={stack.token}")


def _sigterm_as_interrupt() -> None:
    """Treat SIGTERM like Ctrl-C: the try/finally around the stack then stops its children."""

    def handler(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _register_resource_commands() -> None:
    from twinkle_cli.chat import chat
    from twinkle_cli.projects import projects
    from twinkle_cli.resources import checkpoints, files, jobs
    from twinkle_cli.serve import serve
    from twinkle_cli.tokens import tokens

    cli.add_command(projects)
    cli.add_command(tokens)
    cli.add_command(jobs)
    cli.add_command(files)
    cli.add_command(checkpoints)
    cli.add_command(chat)
    cli.add_command(serve)


_register_resource_commands()


def main() -> None:
    try:
        # Click's own handling, except for Ctrl-C: it prints "Aborted!" and exits 1, the code that
        # `jobs wait` and `chat` give a failed job; an interrupted command exits 130, as the shell
        # reports SIGINT.
        cli.main(standalone_mode=False)
    except (KeyboardInterrupt, click.exceptions.Abort):
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
