"""The Twinkle Jobs API server: FastAPI over SQLAlchemy, the record of every job."""
