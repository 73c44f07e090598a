"""OpenAI's inference API (`/v1/models`, `/v1/chat/completions`, `/v1/completions`) over what the
project trained: names resolved to checkpoints in SQL, requests relayed to serving hosts."""
