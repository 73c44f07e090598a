"""Exports of checkpoints as standalone Hugging Face models: request, follow, download."""
