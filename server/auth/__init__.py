"""API tokens: creation (shown once, stored hashed), authentication, scopes and rate limits."""
