"""Bodies of the inference endpoints, shaped as OpenAI's chat/completions and models APIs.

Requests declare the fields that the service documents and checks here (a bad value is a 400
naming the field before any host is asked); other OpenAI keys (`user`, `stream_options`, ...)
pass through to the serving host, which knows what its engine supports. `twinkle` is the one key
a client may not send: the server fills it in for the host (which checkpoint, which base).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from server.errors import InvalidRequest

MAX_CHOICES = 16
MAX_STOP_SEQUENCES = 4
MAX_SEED = 2**63 - 1
RESERVED_KEY = "twinkle"


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(
        min_length=1,
        max_length=512,
        description="A succeeded job's `fine_tuned_model` (`ft:...`), or `JOB_ID:ckpt-STEP` for any "
        "complete checkpoint of a job",
    )
    max_tokens: int | None = Field(default=None, ge=1, description="Tokens to generate at most")
    temperature: float | None = Field(default=None, ge=0, le=2, description="0: greedy")
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = Field(default=None, description=f"Up to {MAX_STOP_SEQUENCES} sequences")
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, description="Same seed, same text")
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES, description="Choices to generate")
    stream: bool | None = Field(default=None, description="Server-Sent Events, one chunk per token")

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        if isinstance(value, list) and any(not s for s in value):
            raise ValueError("a stop sequence may not be empty")
        return value

    def refuse_reserved_key(self) -> None:
        if RESERVED_KEY in (self.model_extra or {}):
            # A client must not choose the checkpoint or the base the host loads: both are resolved
            # from SQL, within the caller's project.
            raise InvalidRequest(f"'{RESERVED_KEY}' is set by the server, not the client", param=RESERVED_KEY)

    def host_body(self, target: dict[str, Any]) -> dict[str, Any]:
        """The body for the serving host: what the client sent, plus the resolved `twinkle` key."""
        return {**self.model_dump(mode="json", exclude_unset=True), RESERVED_KEY: target}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionCreate(_Sampling):
    """`POST /v1/chat/completions`, as OpenAI's client sends it."""

    messages: list[ChatMessage] = Field(
        min_length=1, description="Rendered with the checkpoint's chat template"
    )
    max_completion_tokens: int | None = Field(
        default=None, ge=1, description="OpenAI's newer name of max_tokens"
    )


TokenId = Annotated[int, Field(ge=0)]
PROMPT_FORMS = (
    "a prompt is a string, a list of strings, a list of token ids, or a list of such lists, none empty"
)


class CompletionCreate(_Sampling):
    """`POST /v1/completions`, as OpenAI's client sends it."""

    prompt: str | list[str] | list[TokenId] | list[list[TokenId]] = Field(
        description="The text to continue; several texts; or token ids (one prompt's, or several)"
    )

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _one_of_openais_forms(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # Pydantic's own error lists each form of the union in turn (`prompt.str: ...; also
        # prompt.list[str]...`): one sentence that says what a prompt may be names the field.
        try:
            prompt = handler(value)
        except ValidationError:
            prompt = None
        if prompt is None or prompt == [] or any(item == [] for item in prompt):
            raise ValueError(PROMPT_FORMS)
        return prompt


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"] | None
    logprobs: Any = None


class ChatCompletion(BaseModel):
    """The answer without `stream` (with it: `chat.completion.chunk` objects as Server-Sent Events)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str = Field(description="The `model` of the request")
    choices: list[ChatChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: Any = None


class Completion(BaseModel):
    """The answer without `stream` (with it: `text_completion` chunks as Server-Sent Events)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelObject(BaseModel):
    id: str = Field(description="The name to pass as `model`")
    object: Literal["model"] = "model"
    created: int
    owned_by: str = Field(description="The project of a fine-tuned model; 'twinkle' for a base model")
    parent: str | None = Field(default=None, description="A fine-tuned model's base model (`model_id`)")
    job_id: str | None = Field(default=None, description="The job that trained a fine-tuned model")
    servable: bool = Field(
        description="True for fine-tuned models. Base models are listed because the project trains "
        "on them; the service serves what it trained, so calling one is a 404"
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]
