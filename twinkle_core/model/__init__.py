"""TransformersModel and its strategies (`accelerate`, `native_fsdp`)."""

from twinkle_core.model.transformers_model import TransformersModel
from twinkle_core.remote import remote_class

# Ray mode: TransformersModel(..., remote_group=...) runs one actor per rank of its device mesh.
# (The decorator changes the class in place.)
remote_class(execute="ranks", split_args=("inputs",))(TransformersModel)

__all__ = ["TransformersModel"]
