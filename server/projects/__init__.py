"""Administration: projects (quotas, default webhook, webhook secret) and API tokens."""
