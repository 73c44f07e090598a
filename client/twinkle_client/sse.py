"""A small Server-Sent Events reader: lines in, `(event name, id, data)` messages out."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    """One dispatched SSE message. `event` is "message" when the server named none.

    A `Message` with `event == ""` is a heartbeat: the reader saw a line (a comment such as a
    keep-alive, or a field of a message still arriving) and hands control back to the caller so
    that it can check a deadline even while no event arrives.
    """

    event: str
    id: str | None
    data: str


HEARTBEAT = Message("", None, "")


def read_messages(lines: Iterable[str]) -> Iterator[Message]:
    """Parse the `text/event-stream` format (the fields this service sends: event, id, data)."""
    event, event_id = "", None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield Message(event or "message", event_id, "\n".join(data))
            else:
                yield HEARTBEAT
            event, event_id, data = "", None, []
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            event_id = value
        # "retry" and comments (an empty field name) need no action; control goes back anyway.
        yield HEARTBEAT
