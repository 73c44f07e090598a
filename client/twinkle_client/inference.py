"""Inference on fine-tuned models: the server's OpenAI-compatible `/v1/chat/completions`,
`/v1/completions` and `/v1/models`.

`model` is a job's `fine_tuned_model` (`ft:...`) or `JOB_ID:ckpt-STEP` for one checkpoint
(`checkpoint_model` spells it). With `stream=True` the answer is a `TextStream`: an iterator of
text deltas as the server generates them. Leaving it early (`break`, `close()`, the end of a
`with` block) closes the connection, which stops the generation and frees the server's slot.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Generator, Iterator, Sequence
from typing import Any, Literal, Protocol, overload

import httpx

from twinkle_client.paths import segment
from twinkle_client.sse import read_messages

Json = dict[str, Any]


class Transport(Protocol):
    """What `Inference` needs of `TwinkleClient` (a protocol: client.py imports this module)."""

    timeout: float

    def request(self, method: str, path: str, *, stream: bool = False, **kwargs: Any) -> httpx.Response: ...

    def json(self, method: str, path: str, **kwargs: Any) -> Any: ...


# Generation can outlast the client's default timeout: loading a model, then writing
# max_tokens tokens. A stream's read timeout is the longest silence between two tokens.
GENERATION_TIMEOUT = 600.0
DONE = "[DONE]"


def checkpoint_model(job_id: str, step: int) -> str:
    """The model name of one complete checkpoint of a job: `JOB_ID:ckpt-STEP`."""
    return f"{job_id}:ckpt-{step}"


class StreamError(Exception):
    """The server reported an error inside a stream that had already begun (HTTP 200)."""

    def __init__(self, error: Json) -> None:
        self.type = str(error.get("type", "api_error"))
        self.code = error.get("code")
        self.message = str(error.get("message", "")) or "the stream failed"
        super().__init__(f"{self.type}: {self.message}")


class TextStream:
    """The text deltas of a streamed completion, in the order the server sends them.

    With `n > 1` the deltas of every choice arrive interleaved: `texts[i]` holds choice `i`'s
    text so far. After the stream ends, `finish_reasons[i]` says why each choice stopped
    ("stop" or "length") and `id` is the completion's id.
    """

    def __init__(self, response: httpx.Response, kind: Literal["chat", "text"]) -> None:
        self._response = response
        self._kind = kind
        self._deltas = self._read()
        self.id: str | None = None
        self.model: str | None = None
        self.texts: dict[int, str] = {}
        self.finish_reasons: dict[int, str | None] = {}

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._deltas)

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def text(self) -> str:
        """The first choice's text so far (the whole answer once the stream has ended)."""
        return self.texts.get(0, "")

    def close(self) -> None:
        """Stop reading; closing the connection tells the server to stop generating."""
        self._deltas.close()
        self._response.close()

    def _read(self) -> Generator[str, None, None]:
        try:
            for message in read_messages(self._response.iter_lines()):
                if not message.data:
                    continue  # a keep-alive or a message still arriving
                if message.data == DONE:
                    return
                chunk: Json = json.loads(message.data)
                if "error" in chunk:
                    raise StreamError(chunk["error"] or {})
                self.id = chunk.get("id", self.id)
                self.model = chunk.get("model", self.model)
                for choice in chunk.get("choices") or []:
                    index = int(choice.get("index", 0))
                    if choice.get("finish_reason") is not None:
                        self.finish_reasons[index] = choice["finish_reason"]
                    delta = _delta_text(choice, self._kind)
                    if delta:
                        self.texts[index] = self.texts.get(index, "") + delta
                        yield delta
        finally:
            self._response.close()


def _delta_text(choice: Json, kind: Literal["chat", "text"]) -> str:
    if kind == "chat":
        return str((choice.get("delta") or {}).get("content") or "")
    return str(choice.get("text") or "")


def message_text(completion: Json, index: int = 0) -> str:
    """The text of choice `index` of a non-streamed chat or text completion."""
    choice = completion["choices"][index]
    if "message" in choice:
        return str(choice["message"].get("content") or "")
    return str(choice.get("text") or "")


class Inference:
    """`client.inference`: chat and text completions from fine-tuned models."""

    def __init__(self, client: Transport) -> None:
        self._c = client

    def models(self) -> builtins.list[Json]:
        """The models this token's project may call: base models in use and every succeeded job's."""
        return builtins.list(self._c.json("GET", "/v1/models")["data"])

    def job_model(self, job_id: str) -> str | None:
        """The model name of a job's final weights (its `fine_tuned_model`); None until the job
        has succeeded. `checkpoint_model(job_id, step)` names any complete checkpoint."""
        job: Json = self._c.json("GET", f"/v1/jobs/{segment(job_id)}")
        model = job.get("fine_tuned_model")
        return str(model) if model else None

    @overload
    def chat(
        self,
        model: str,
        messages: Sequence[Json],
        *,
        stream: Literal[False] = False,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        top_p: float | None = ...,
        stop: str | Sequence[str] | None = ...,
        seed: int | None = ...,
        n: int | None = ...,
        timeout: float = ...,
        **extra: Any,
    ) -> Json: ...

    @overload
    def chat(
        self,
        model: str,
        messages: Sequence[Json],
        *,
        stream: Literal[True],
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        top_p: float | None = ...,
        stop: str | Sequence[str] | None = ...,
        seed: int | None = ...,
        n: int | None = ...,
        timeout: float = ...,
        **extra: Any,
    ) -> TextStream: ...

    def chat(
        self,
        model: str,
        messages: Sequence[Json],
        *,
        stream: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | Sequence[str] | None = None,
        seed: int | None = None,
        n: int | None = None,
        timeout: float = GENERATION_TIMEOUT,
        **extra: Any,
    ) -> Json | TextStream:
        """A chat completion: `messages` as OpenAI's (`{"role", "content"}`), rendered by the
        checkpoint's own chat template. `stream=True` returns a `TextStream` of deltas."""
        body = _body(model, max_tokens, temperature, top_p, stop, seed, n, extra)
        body["messages"] = builtins.list(messages)
        return self._send("/v1/chat/completions", body, stream, timeout, "chat")

    @overload
    def completions(
        self,
        model: str,
        prompt: str,
        *,
        stream: Literal[False] = False,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        top_p: float | None = ...,
        stop: str | Sequence[str] | None = ...,
        seed: int | None = ...,
        n: int | None = ...,
        timeout: float = ...,
        **extra: Any,
    ) -> Json: ...

    @overload
    def completions(
        self,
        model: str,
        prompt: str,
        *,
        stream: Literal[True],
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        top_p: float | None = ...,
        stop: str | Sequence[str] | None = ...,
        seed: int | None = ...,
        n: int | None = ...,
        timeout: float = ...,
        **extra: Any,
    ) -> TextStream: ...

    def completions(
        self,
        model: str,
        prompt: str,
        *,
        stream: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | Sequence[str] | None = None,
        seed: int | None = None,
        n: int | None = None,
        timeout: float = GENERATION_TIMEOUT,
        **extra: Any,
    ) -> Json | TextStream:
        """A text completion of `prompt` as given (no chat template)."""
        body = _body(model, max_tokens, temperature, top_p, stop, seed, n, extra)
        body["prompt"] = prompt
        return self._send("/v1/completions", body, stream, timeout, "text")

    def _send(
        self, path: str, body: Json, stream: bool, timeout: float, kind: Literal["chat", "text"]
    ) -> Json | TextStream:
        # The transport retries 429/503 with the server's Retry-After (a model still loading,
        # no free slot): nothing was generated yet, so sending the request again is safe.
        limits = httpx.Timeout(self._c.timeout, read=timeout)
        if not stream:
            result: Json = self._c.json("POST", path, json=body, timeout=limits)
            return result
        body["stream"] = True
        headers = {"Accept": "text/event-stream"}
        response = self._c.request("POST", path, json=body, headers=headers, timeout=limits, stream=True)
        return TextStream(response, kind)


def _body(
    model: str,
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    stop: str | Sequence[str] | None,
    seed: int | None,
    n: int | None,
    extra: Json,
) -> Json:
    """The OpenAI request body; parameters left at None are left out (the server's defaults)."""
    given = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "stop": stop if stop is None or isinstance(stop, str) else builtins.list(stop),
        "seed": seed,
        "n": n,
    }
    return {"model": model, **{k: v for k, v in given.items() if v is not None}, **extra}
