"""Keyset pagination and the list envelope `{"object": "list", "data", "first_id", "last_id", "has_more"}`.

Lists are ordered newest first by `(created_at, id)`; `after` is the id of the last object the
client saw. A keyset cursor (rather than an offset) keeps pages stable while rows are inserted:
new rows land before the first page and never shift the later ones.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar, TypeVarTuple

from pydantic import BaseModel
from sqlalchemy import BindParameter, ColumnElement, Select, and_, or_
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
    created_col: ColumnElement[datetime] | InstrumentedAttribute[datetime],
    id_col: ColumnElement[str] | InstrumentedAttribute[str],
    after: tuple[datetime, str] | tuple[BindParameter[Any], BindParameter[Any]] | None,
    limit: int | None,
) -> Select[*Columns]:
    """Order newest first and start strictly after the cursor row (values, or bound parameters of
    a statement built once); fetch one extra for has_more (`limit` None: the caller limits)."""
    if after is not None:
        created, ident = after
        query = query.where(or_(created_col < created, and_(created_col == created, id_col < ident)))
    query = query.order_by(created_col.desc(), id_col.desc())
    return query if limit is None else query.limit(limit + 1)


def list_envelope(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """`ListEnvelope` as plain data, for a page presented straight from rows."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def split_page(rows: list[RowT], limit: int) -> tuple[list[RowT], bool]:
    return rows[:limit], len(rows) > limit
