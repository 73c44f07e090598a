"""A small typed Python client for the Twinkle Jobs API.

    from twinkle_client import TwinkleClient
    client = TwinkleClient("http://127.0.0.1:8000", token="tj_...")
    job = client.jobs.create(spec={...}, name="first")
    for event in client.jobs.follow(job["id"]):
        print(event["message"])
    # once it succeeded: chat with the job's model (or "JOB_ID:ckpt-STEP"), token by token
    model = client.inference.job_model(job["id"])
    for delta in client.inference.chat(model, [{"role": "user", "content": "Hi"}], stream=True):
        print(delta, end="")

Retries 429 and 5xx responses and connection errors with exponential back-off (honouring
`Retry-After`), sends an idempotency key with every create (job, clone, file upload) so that a
retried create cannot make two, and raises `APIError` carrying the server's error envelope
(`InvalidId`, before any request, for an empty id).
"""

from twinkle_client.client import APIError, TwinkleClient
from twinkle_client.inference import StreamError, TextStream, checkpoint_model
from twinkle_client.paths import InvalidId

__all__ = ["APIError", "InvalidId", "StreamError", "TextStream", "TwinkleClient", "checkpoint_model"]
