"""Who is calling: what authentication yields and every service checks against.

A module of its own, so that the principal cache and the token service both use it without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token and the project every object they touch must belong to."""

    token_id: str
    project_id: str
    project_name: str
    scopes: frozenset[str]
    rate_limit_per_minute: int | None

    def has(self, scope: str) -> bool:
        return scope in self.scopes
