"""OpenAI's chat/completions and completions protocol: request bodies in, answers and SSE chunks
out, in the exact shapes the official `openai` package parses.

The API server has checked the common fields already; the host checks them again (it is called
by whoever holds the serving secret) and adds what needs the model: the prompt rendered with
the checkpoint's chat template, and its length against the context. Options that would change
the answer and that this host cannot honour (logprobs, tools, penalties, ...) are refused with
the field named, never silently ignored; harmless ones (`user`, `metadata`, ...) are accepted.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from serving.errors import InvalidRequest
from serving.sampling import SamplingParams
from serving.targets import TwinkleKey

MAX_CHOICES = 16
MAX_STOP_SEQUENCES = 4
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Keys that change the answer, with the value that means "not used".
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none"),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM's extension, for benchmarks: always generate max_tokens
    twinkle: TwinkleKey

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        if any(not stop for stop in stops):
            raise ValueError("a stop sequence may not be empty")
        return value

    def refuse_unsupported(self) -> None:
        for key, value in (self.model_extra or {}).items():
            if key in UNSUPPORTED and value not in UNSUPPORTED[key]:
                raise InvalidRequest(
                    f"{key} is not supported by this service", param=key, code="unsupported_parameter"
                )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling(
        self, prompt_tokens: int, context_length: int, *, param: str, default: int | None
    ) -> SamplingParams:
        """The sampling parameters, with max_tokens checked against what the context leaves."""
        room = context_length - prompt_tokens
        requested = self.requested_max_tokens()
        if room < 1 or (requested is not None and requested > room):
            asked = f" and max_tokens asks for {requested} more" if requested is not None else ""
            raise InvalidRequest(
                f"this model's context is {context_length} tokens: the {param} "
                f"{'take' if param == 'messages' else 'takes'} {prompt_tokens}"
                f"{asked}; shorten the {param} or ask for fewer tokens",
                param=param,
                code="context_length_exceeded",
            )
        max_tokens = requested if requested is not None else min(default or room, room)
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            n=self.n or 1,
            stop=stop,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
        )


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self, index: int) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for number, part in enumerate(self.content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequest(
                    "only text content parts are supported", param=f"messages.{index}.content.{number}"
                )
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # the newer name of max_tokens

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


TokenId = Annotated[int, Field(ge=0)]
# A prompt as OpenAI takes it: a text, texts, a prompt's token ids, or several prompts' ids.
Prompt = str | list[str] | list[TokenId] | list[list[TokenId]]


class CompletionRequest(_GenerationRequest):
    prompt: Prompt

    @field_validator("prompt")
    @classmethod
    def _some_prompt(cls, value: Prompt) -> Prompt:
        if isinstance(value, list) and (not value or any(isinstance(p, list) and not p for p in value)):
            raise ValueError("at least one prompt, and none empty")
        return value

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: its text or its token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        items: list[str | int | list[int]] = list(self.prompt)
        if all(isinstance(item, int) for item in items):  # one prompt's ids
            return [[item for item in items if isinstance(item, int)]]
        return [item for item in items if not isinstance(item, int)]


def chat_prompt_ids(tokenizer: Any, messages: list[ChatMessage]) -> list[int]:
    """The messages rendered by the checkpoint's own chat template, ready for the assistant."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest(
            "this checkpoint's tokenizer has no chat template: use /v1/completions",
            param="messages",
            code="no_chat_template",
        )
    conversation = [{"role": m.role, "content": m.text(i)} for i, m in enumerate(messages)]
    try:
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # the template's own checks (jinja's raise_exception: roles, order)
        raise InvalidRequest(f"the chat template refused the messages: {exc}", param="messages") from exc
    # The template writes the special tokens it wants (BOS included); the tokenizer adds none.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def completion_prompt_ids(tokenizer: Any, prompt: str | list[int], index: int, many: bool) -> list[int]:
    """A prompt's token ids: its text tokenized, or the ids it gave, each one the tokenizer's."""
    param = f"prompt.{index}" if many else "prompt"
    ids = list(tokenizer(prompt)["input_ids"]) if isinstance(prompt, str) else prompt
    if not ids:
        raise InvalidRequest("the prompt is empty", param=param)
    vocabulary = len(tokenizer)
    if max(ids) >= vocabulary:
        raise InvalidRequest(
            f"token id {max(ids)} is not in the model's vocabulary (0 to {vocabulary - 1})", param=param
        )
    return ids


# ------------------------------------------------------------------------------------ answers
@dataclass
class Choice:
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0


@dataclass
class Answer:
    """One request's answer as it is being built: ids and timestamps shared by every chunk."""

    object_prefix: str
    model: str
    prompt_tokens: int
    choices: list[Choice]
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))
    began: float = field(default_factory=time.monotonic)  # for the host's log line

    def __post_init__(self) -> None:
        self.id = self.id or f"{self.object_prefix}-{uuid.uuid4().hex}"

    def usage(self) -> dict[str, int]:
        completion = sum(choice.completion_tokens for choice in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    # chat
    def chat_completion(self) -> dict[str, Any]:
        choices = [
            {
                "index": index,
                "message": {"role": "assistant", "content": choice.text, "refusal": None},
                "logprobs": None,
                "finish_reason": choice.finish_reason,
            }
            for index, choice in enumerate(self.choices)
        ]
        return {
            **self._head("chat.completion"),
            "choices": choices,
            "usage": self.usage(),
            "system_fingerprint": None,
        }

    def chat_chunk(self, index: int, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("chat.completion.chunk"), "choices": [choice], "system_fingerprint": None}

    def usage_chunk(self, kind: str) -> dict[str, Any]:
        return {**self._head(kind), "choices": [], "usage": self.usage()}

    # completions
    def text_completion(self) -> dict[str, Any]:
        choices = [
            {"index": index, "text": choice.text, "logprobs": None, "finish_reason": choice.finish_reason}
            for index, choice in enumerate(self.choices)
        ]
        return {**self._head("text_completion"), "choices": choices, "usage": self.usage()}

    def text_chunk(self, index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}
