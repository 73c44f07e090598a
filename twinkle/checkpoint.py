"""Reading checkpoints that `TransformersModel.save` wrote (see twinkle_core.checkpoint)."""

from twinkle_core.checkpoint import (
    COMPLETE_MARKER,
    TRAINER_STATE_FILE,
    is_complete,
    latest_complete_checkpoint,
    read_trainer_state,
)

__all__ = [
    "COMPLETE_MARKER",
    "TRAINER_STATE_FILE",
    "is_complete",
    "latest_complete_checkpoint",
    "read_trainer_state",
]
