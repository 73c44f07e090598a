"""Ray mode: `initialize(mode='ray')`, the `remote_class` decorator and the driver-side handles.

Imports neither Ray nor torch: the decorator is applied to light modules (datasets) that the API
server imports, and Ray is only needed once `initialize(mode='ray')` is called. See docs/ray.md.
"""

from twinkle_core.remote.decorator import remote_class
from twinkle_core.remote.runtime import initialize, is_ray_mode, shutdown

__all__ = ["initialize", "is_ray_mode", "remote_class", "shutdown"]
