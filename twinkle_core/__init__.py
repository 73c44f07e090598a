"""twinkle_core: the training library that every Twinkle job runs (public face: the `twinkle` package).

Heavy imports (torch, transformers) are deferred so that `twinkle_core.spec` stays cheap to import
for the server and the worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["DeviceMesh", "initialize", "remote_class", "shutdown"]

if TYPE_CHECKING:
    from twinkle_core.mesh import DeviceMesh
    from twinkle_core.remote import initialize, remote_class, shutdown


def __getattr__(name: str) -> Any:
    if name == "DeviceMesh":
        from twinkle_core.mesh import DeviceMesh

        return DeviceMesh
    if name in ("initialize", "remote_class", "shutdown"):
        import twinkle_core.remote

        return getattr(twinkle_core.remote, name)
    raise AttributeError(name)
