"""The Alembic environment and revisions: the only way the schema changes.

A package, so that it ships in the wheel and an installed service can migrate.
"""
