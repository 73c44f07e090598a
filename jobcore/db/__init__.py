"""The data layer: models, engine and sessions, shared by the server and the worker."""
