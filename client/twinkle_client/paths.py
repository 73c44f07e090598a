"""Ids in request paths.

An id is one path segment: quoted, so that a `/`, `?` or `#` in it cannot reach another
resource or turn into a query (`jobs.delete("../files/file-1")` deleted the file), and never
empty (an empty id asked for the list and read it as one object)."""

from __future__ import annotations

from urllib.parse import quote


class InvalidId(ValueError):
    """An id that cannot name anything (empty, or a dot segment); raised before any request."""


def segment(value: str) -> str:
    """`value` as one path segment of a request."""
    text = str(value)
    if text.strip() in ("", ".", ".."):
        raise InvalidId(f"not an id: {text!r}")
    return quote(text, safe="")
