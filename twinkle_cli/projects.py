"""`twinkle-jobs projects create|list|get|update|rotate-secret`: projects through the API.

Needs an admin token (`--token` or TWINKLE_TOKEN). An admin of the project "default" (the
bootstrap token is one) manages every project and alone creates projects and sets quotas and
Slurm accounts; an
admin of another project sees and changes its own (default webhook, secret rotation). The webhook
secret is printed by `create` and `rotate-secret` only, the two times the server shows it.
"""

from __future__ import annotations

from typing import Any

import click

from twinkle_cli.resources import OUTPUT, _client, _emit, _group, handle_api_errors

SLURM_ACCOUNT_HELP = "The Slurm account (sbatch --account) of the project's Slurm jobs (operator only)"


def _limit(value: str | None) -> int | str | None:
    """A quota option: a number, or `none` to lift it; None when the option was not given."""
    if value is None:
        return None
    if value.lower() in ("none", "unlimited"):
        return "none"
    if not value.isdigit():
        raise click.BadParameter("a number >= 0, or 'none' to lift the limit")
    return int(value)


def _lines(project: dict[str, Any]) -> list[str]:
    def show(value: Any) -> str:
        return "unlimited" if value is None else str(value)

    lines = [
        f"{project['id']}  {project['name']}",
        f"  max_queued_jobs   {show(project['max_queued_jobs'])}",
        f"  max_running_jobs  {show(project['max_running_jobs'])}",
        f"  webhook_url       {project['webhook_url'] or '-'}",
        f"  slurm_account     {project.get('slurm_account') or '- (the worker default)'}",
    ]
    if "webhook_secret" in project:
        lines.append(f"  webhook_secret    {project['webhook_secret']}  (shown once: store it now)")
    return lines


@_group
def projects() -> None:
    """Create projects and set their quotas, Slurm account, default webhook and webhook secret (admin)."""


@projects.command("create")
@click.argument("name")
@click.option("--max-queued-jobs", type=click.IntRange(min=0), default=None, help="Default: unlimited")
@click.option("--max-running-jobs", type=click.IntRange(min=0), default=None, help="Default: unlimited")
@click.option("--webhook-url", default=None, help="Where jobs without their own webhook_url report")
@click.option("--slurm-account", default=None, help=SLURM_ACCOUNT_HELP)
@OUTPUT
@click.pass_context
@handle_api_errors
def projects_create(
    ctx: click.Context,
    name: str,
    max_queued_jobs: int | None,
    max_running_jobs: int | None,
    webhook_url: str | None,
    slurm_account: str | None,
    output: str,
) -> None:
    """Create a project; prints its webhook secret, this once."""
    project = _client(ctx).projects.create(
        name,
        max_queued_jobs=max_queued_jobs,
        max_running_jobs=max_running_jobs,
        webhook_url=webhook_url,
        slurm_account=slurm_account,
    )
    _emit(project, output, _lines(project))


@projects.command("list")
@OUTPUT
@click.pass_context
@handle_api_errors
def projects_list(ctx: click.Context, output: str) -> None:
    """The projects this token administers (an operator: every one)."""
    found = list(_client(ctx).projects.list())
    _emit(found, output, [line for p in found for line in _lines(p)] or ["no projects"])


@projects.command("get")
@click.argument("project")
@OUTPUT
@click.pass_context
@handle_api_errors
def projects_get(ctx: click.Context, project: str, output: str) -> None:
    """One project, by id or name (never its webhook secret)."""
    found = _client(ctx).projects.get(project)
    _emit(found, output, _lines(found))


@projects.command("update")
@click.argument("project")
@click.option("--max-queued-jobs", default=None, help="A number, or 'none' to lift the limit (operator only)")
@click.option(
    "--max-running-jobs", default=None, help="A number, or 'none' to lift the limit (operator only)"
)
@click.option("--webhook-url", default=None, help="The default webhook URL, or 'none' to remove it")
@click.option("--slurm-account", default=None, help=f"{SLURM_ACCOUNT_HELP}, or 'none' for the worker default")
@OUTPUT
@click.pass_context
@handle_api_errors
def projects_update(
    ctx: click.Context,
    project: str,
    max_queued_jobs: str | None,
    max_running_jobs: str | None,
    webhook_url: str | None,
    slurm_account: str | None,
    output: str,
) -> None:
    """Change a project's quotas, Slurm account or default webhook; options not given stay as
    they are."""
    changes: dict[str, Any] = {}
    for key, raw in (("max_queued_jobs", max_queued_jobs), ("max_running_jobs", max_running_jobs)):
        value = _limit(raw)
        if value is not None:
            changes[key] = None if value == "none" else value
    if webhook_url is not None:
        changes["webhook_url"] = None if webhook_url.lower() == "none" else webhook_url
    if slurm_account is not None:
        changes["slurm_account"] = None if slurm_account.lower() == "none" else slurm_account
    if not changes:
        raise click.UsageError(
            "nothing to change: give --max-queued-jobs, --max-running-jobs, --webhook-url or --slurm-account"
        )
    updated = _client(ctx).projects.update(project, **changes)
    _emit(updated, output, _lines(updated))


@projects.command("rotate-secret")
@click.argument("project")
@OUTPUT
@click.pass_context
@handle_api_errors
def projects_rotate_secret(ctx: click.Context, project: str, output: str) -> None:
    """Replace the project's webhook secret; prints the new one, this once. The old one stops
    verifying at once (docs/webhooks.md)."""
    rotated = _client(ctx).projects.rotate_webhook_secret(project)
    _emit(rotated, output, _lines(rotated))
