"""jobcore: what the API server and the worker both own.

The SQL models and session (`jobcore.db`), the migration runner, the settings, the job state
machine and its one transition function (`jobcore.jobs`), checkpoint storage, and the broker
contract (the wake-up queue). `server` and `worker` import this package and never each other;
`twinkle`/`twinkle_core` (the training library) import none of them. See docs/architecture.md.
"""
