"""twinkle: the training library under the names the seed's usage example imports.

    from twinkle import DeviceMesh
    from twinkle.model import TransformersModel
    from twinkle.dataloader import DataLoader

Every name here is the very object that `twinkle_core` defines (re-exported, never copied), so
`twinkle.model.TransformersModel is twinkle_core.model.TransformersModel`. `twinkle_core` stays the
implementation package the service imports; this package is its public face. Like `twinkle_core`,
it imports torch only when a name that needs it is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import twinkle_core

__all__ = ["DeviceMesh", "initialize", "remote_class", "shutdown"]

if TYPE_CHECKING:
    from twinkle_core import DeviceMesh, initialize, remote_class, shutdown


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(twinkle_core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
