"""Pieces shared by every API domain: list envelopes, cursors, middleware."""
