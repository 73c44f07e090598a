"""`TransformersModel` (see twinkle_core.model), under the seed's import path `twinkle.model`."""

from twinkle_core.model import TransformersModel

__all__ = ["TransformersModel"]
