"""Watching a job: its events (listed and streamed), metric series and rank logs."""
