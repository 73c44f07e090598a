"""Twinkle Jobs workers: Celery tasks that claim jobs from SQL and supervise their torchrun runs."""
