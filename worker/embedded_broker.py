"""Make kombu's SQLAlchemy transport (the embedded broker) safe for several processes.

kombu creates its tables and a queue's row on first use behind a process-local lock only; the
server (publishing a wake-up) and a worker (starting to consume) can both do it at the same
moment, and the loser's "table already exists" or IntegrityError kills the worker at start-up.
In both cases the loser only needs what the winner created.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import sqlalchemy as kombu_sqlalchemy
from sqlalchemy.exc import IntegrityError, OperationalError


class RaceSafeChannel(kombu_sqlalchemy.Channel):
    def _open(self) -> Any:
        try:
            return super()._open()
        except OperationalError as exc:
            if "already exists" not in str(exc):
                raise
            return super()._open()  # the tables exist now; create_all has nothing left to do

    def _get_or_create(self, queue: str) -> Any:
        try:
            return super()._get_or_create(queue)
        except IntegrityError:
            self.session.rollback()
            return self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).one()


def install(poll_seconds: float) -> None:
    transport = kombu_sqlalchemy.Transport
    transport.Channel = RaceSafeChannel
    # Set on the class: passing polling_interval through broker_transport_options crashes kombu 5.7.0.
    transport.polling_interval = poll_seconds
