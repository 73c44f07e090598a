"""OpenAI-compatible fine-tuning endpoints over the same job store."""
