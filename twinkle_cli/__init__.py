"""The `twinkle-jobs` command line: run the service (server, worker, up, demo) and administer it."""
