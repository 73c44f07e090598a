"""Ray mode (see twinkle_core.remote and docs/ray.md), as `twinkle.remote`."""

from twinkle_core.remote import initialize, is_ray_mode, remote_class, shutdown

__all__ = ["initialize", "is_ray_mode", "remote_class", "shutdown"]
