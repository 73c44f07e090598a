"""A job's checkpoints: listing and archive downloads."""
