"""Reading checkpoints one tensor at a time, so that exporting a stage never loads the whole model."""

from shards.checkpoint.base import Checkpoint
from shards.checkpoint.resolve import open_checkpoint

__all__ = ["Checkpoint", "open_checkpoint"]
