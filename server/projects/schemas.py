"""Bodies of the admin API: projects and tokens. Secrets appear only in the `...Created` and
`...Rotated` bodies, the answers of the one request that makes them."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from server.common.pagination import ListEnvelope
from server.jobs.schemas import check_webhook_url

# Names travel in URL paths (`/v1/projects/{name}`) and shell scripts: keep them plain.
PROJECT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# A Slurm account name as it goes to `sbatch --account=`: what sacctmgr names accounts with
# (letters, digits, '_', '.', '-'; Slurm compares them case-insensitively), nothing a shell or
# Slurm's option parser reads specially, at most 64 characters.
SLURM_ACCOUNT = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
SLURM_ACCOUNT_HELP = "Slurm account (sbatch --account) of its launcher='slurm' jobs, set by the operator"
QUOTA_MAX = 1_000_000
Scope = Literal["read", "write", "admin"]


def _default_scopes() -> list[Scope]:
    return ["read", "write"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProjectCreate(_Body):
    """A new project (operators only). Its webhook secret is in the answer, and only there."""

    name: str = Field(pattern=PROJECT_NAME, description="1-128 letters, digits, '.', '_' or '-'")
    max_queued_jobs: int | None = Field(default=None, ge=0, le=QUOTA_MAX, description="null: unlimited")
    max_running_jobs: int | None = Field(default=None, ge=0, le=QUOTA_MAX, description="null: unlimited")
    webhook_url: str | None = Field(
        default=None, max_length=2048, description="Default webhook of jobs submitted without their own"
    )
    slurm_account: str | None = Field(
        default=None, pattern=SLURM_ACCOUNT, description=f"{SLURM_ACCOUNT_HELP}; null: the worker's default"
    )

    _webhook = field_validator("webhook_url")(check_webhook_url)


class ProjectUpdate(_Body):
    """Only the fields sent change; `null` clears one. Quotas are the operator's to set."""

    max_queued_jobs: int | None = Field(default=None, ge=0, le=QUOTA_MAX, description="null: unlimited")
    max_running_jobs: int | None = Field(default=None, ge=0, le=QUOTA_MAX, description="null: unlimited")
    webhook_url: str | None = Field(default=None, max_length=2048, description="null: no default webhook")
    slurm_account: str | None = Field(
        default=None, pattern=SLURM_ACCOUNT, description=f"{SLURM_ACCOUNT_HELP}; null: the worker's default"
    )

    _webhook = field_validator("webhook_url")(check_webhook_url)


class ProjectOut(BaseModel):
    id: str
    object: Literal["project"] = "project"
    name: str
    max_queued_jobs: int | None
    max_running_jobs: int | None
    webhook_url: str | None = Field(description="Jobs submitted without a webhook_url report here")
    slurm_account: str | None = Field(
        description=f"{SLURM_ACCOUNT_HELP}; null: the worker's TWINKLE_SLURM_ACCOUNT"
    )
    created_at: datetime


class ProjectWithSecret(ProjectOut):
    webhook_secret: str = Field(
        description="Signs this project's webhook deliveries (docs/webhooks.md). Shown only in this "
        "answer: store it now; a lost secret is replaced by rotating it"
    )


class ProjectList(ListEnvelope[ProjectOut]):
    pass


class TokenCreate(_Body):
    """A new API token. The plain token is in the answer, and only there."""

    project: str | None = Field(
        default=None, max_length=128, description="Project id or name; default: the caller's project"
    )
    name: str = Field(default="", max_length=128, description="A label to recognise the token by")
    scopes: list[Scope] = Field(
        default_factory=_default_scopes,
        min_length=1,
        max_length=3,
        description="admin implies write, write implies read",
    )
    rate_limit_per_minute: int | None = Field(default=None, ge=1, le=1_000_000, description="null: unlimited")
    expires_at: AwareDatetime | None = Field(default=None, description="null: valid until revoked")


class TokenOut(BaseModel):
    id: str
    object: Literal["token"] = "token"
    project_id: str
    name: str
    scopes: list[str]
    rate_limit_per_minute: int | None
    expires_at: datetime | None
    created_at: datetime
    last_used_at: datetime | None
    revoked: bool


class TokenCreated(TokenOut):
    token: str = Field(description="The bearer token. Shown only in this answer; stored as a hash")


class TokenList(ListEnvelope[TokenOut]):
    pass
