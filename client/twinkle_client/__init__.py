"""A small typed Python client for the Twinkle Jobs API.

    from twinkle_client import TwinkleClient
    client = TwinkleClient("http://127.0.0.1:8000", token="tw-...")
    job = client.jobs.create(spec={...}, name="first")
    for event in client.jobs.follow(job["id"]):
        print(event["message"])

Retries 429 and 5xx responses and connection errors with exponential back-off (honouring
`Retry-After`), sends an idempotency key with every create (job, clone, file upload) so that a
retried create cannot make two, and raises `APIError` carrying the server's error envelope.
"""

from twinkle_client.client import APIError, TwinkleClient

__all__ = ["APIError", "TwinkleClient"]
