"""The web dashboard: static ES modules served by the API server (see `router.py` and docs/dashboard.md)."""
