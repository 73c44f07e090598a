"""A checkpoint kept only in object storage, copied onto this host before it loads.

The API server sends such a checkpoint as its `s3://` location (`twinkle.checkpoint`) with its
job id; the host copies it into `<jobs root>/<job id>/checkpoints/step-N` through the code a
resuming worker uses (`jobcore.storage.local_copy`: every object, the completion marker last, a
complete copy already there is reused). The copy is the first part of the load, so it runs in the
load's thread under the same bounded wait: a request waits at most the load timeout and then gets
503 `model_loading` with Retry-After while the copy and the load go on. A location whose objects
are gone (or never completed) is 404 `checkpoint_not_found`; an unreachable store fails the load
(500 `model_load_failed`, retried by the next request).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from jobcore import storage
from jobcore.settings import Settings
from serving.errors import LoadFailed, NotFound
from serving.targets import Target
from twinkle_core import checkpoint as ckpt

log = logging.getLogger(__name__)


def fetcher(settings: Settings) -> Callable[[Target], None]:
    """The fetch step of this host's loads: object storage as the settings configure it (a
    location in another bucket than TWINKLE_ARTIFACT_URL's is read with the same endpoint)."""

    def fetch(target: Target) -> None:
        if target.source is None or ckpt.is_complete(target.checkpoint):
            return
        log.info("fetching %s into %s", target.source, target.checkpoint)
        try:
            storage.local_copy(
                target.source, target.checkpoint.parent.parent, storage.artifact_store(settings), settings
            )
        except FileNotFoundError as exc:
            raise NotFound(str(exc), param="twinkle.checkpoint") from exc
        except Exception as exc:  # the store unreachable, credentials refused, ...
            raise LoadFailed(f"{target.source}: the checkpoint could not be fetched ({exc})") from exc

    return fetch
