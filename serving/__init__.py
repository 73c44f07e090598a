"""The inference host (`twinkle-jobs serve`): serves fine-tuned checkpoints over OpenAI's
chat/completions protocol to the API server, which relays its users' requests here.

GPU work like the worker's, so a package of its own beside it: it imports `jobcore` (settings,
the `serving_hosts` table) and `twinkle_core` (checkpoint layout, hub resolution), never `server`
or `worker`. The parts: `targets` (which checkpoint a request names, checked against the jobs
root), `loading` (a checkpoint into memory), `cache` (the byte-bounded LRU of loaded models),
`sampling` + `generation` (transformers), `vllm_backend` (vLLM on a CUDA host), `engine` (slots
and timeouts over a backend), `protocol` (OpenAI's request and answer shapes), `app` (the HTTP
app), `registry` (the heartbeat in SQL) and `host` (the process).
"""
