"""Keyset pagination and the list envelope `{"object": "list", "data", "first_id", "last_id", "has_more"}`.

Lists are ordered newest first by `(created_at, id)`; `after` is the id of the last object the
client saw. A keyset cursor (rather than an offset) keeps pages stable while rows are inserted:
new rows land before the first page and never shift the later ones.
"""

from __future__ import annotations

from datetime import datetime
from typing import Generic, Literal, TypeVar, TypeVarTuple

from pydantic import BaseModel
from sqlalchemy import Select, and_, or_
from sqlalchemy.orm import InstrumentedAttribute

DEFAULT_LIMIT = 20
MAX_LIMIT = 100

ItemT = TypeVar("ItemT")
RowT = TypeVar("RowT")
Columns = TypeVarTuple("Columns")


class ListEnvelope(BaseModel, Generic[ItemT]):
    object: Literal["list"] = "list"
    data: list[ItemT]
    first_id: str | None
    last_id: str | None
    has_more: bool


def newest_first_after(
    query: Select[*Columns],
    created_col: InstrumentedAttribute[datetime],
    id_col: InstrumentedAttribute[str],
    after: tuple[datetime, str] | None,
    limit: int,
) -> Select[*Columns]:
    """Order newest first and start strictly after the cursor row; fetch one extra for has_more."""
    if after is not None:
        created, ident = after
        query = query.where(or_(created_col < created, and_(created_col == created, id_col < ident)))
    return query.order_by(created_col.desc(), id_col.desc()).limit(limit + 1)


def split_page(rows: list[RowT], limit: int) -> tuple[list[RowT], bool]:
    return rows[:limit], len(rows) > limit
