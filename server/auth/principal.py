"""Who is calling: what authentication yields and every service checks against.

A module of its own, so that the principal cache and the token service both use it without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token and the project every object they touch must belong to."""

    token_id: str
    project_id: str
    project_name: str
    scopes: frozenset[str]
    rate_limit_per_minute: int | None
    expires_at: datetime | None = None

    def has(self, scope: str) -> bool:
        return scope in self.scopes

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    @property
    def is_operator(self) -> bool:
        """An admin of the operator project ("default", the bootstrap token's): administers every
        project. Any other admin token administers its own project only."""
        return self.has("admin") and self.project_name == OPERATOR_PROJECT


# The project whose admin tokens administer the whole service (the bootstrap token is one).
OPERATOR_PROJECT = "default"
