"""The official `openai` package against a running stack: API server, worker and serving host as
the processes a user starts (`twinkle-jobs server|worker|serve`), on the demo's tiny model.

One full and one LoRA job are fine-tuned through OpenAI's fine-tuning API for two steps, then
called by their `fine_tuned_model` (plain and streamed chat, completions on a checkpoint name,
the model list), and a client that leaves in the middle of a stream must free the host's slot.
Nothing is mocked: SQL, the broker, torchrun, the host's generation and the relay are all real.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from live_service import TOKEN, LiveService
from openai.types.chat import ChatCompletionMessageParam

from twinkle_cli.stack import free_port

pytestmark = pytest.mark.slow

PROMPT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "the cat sat on"}]


@dataclass
class Stack:
    service: LiveService
    client: openai.OpenAI
    host_url: str
    jobs: dict[str, Any]  # "full" / "lora" -> the succeeded fine_tuning.job
    base_model: str

    def host_health(self) -> dict[str, Any]:
        secret = (self.service.data_dir / "serving-secret").read_text().strip()
        health: dict[str, Any] = httpx.get(
            f"{self.host_url}/healthz", headers={"Authorization": f"Bearer {secret}"}, timeout=5
        ).json()
        return health


def _wait_healthy(url: str, log: Path, proc: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"serving host not healthy: {log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    from twinkle_core.assets import write_text_dataset

    tmp = tmp_path_factory.mktemp("inference")
    host_port = free_port()
    # One slot, so that a slot held by a client that has gone would show at once.
    service = LiveService.configure(
        tmp, [tiny_model_dir], TWINKLE_SERVING_PORT=str(host_port), TWINKLE_SERVING_SLOTS="1"
    )
    try:
        # The worker and the host wait for the server to migrate the schema: starting them
        # first overlaps their imports with the server's start-up.
        service.start_worker(concurrency=2)
        host = service._spawn(["serve"], "serve.log")
        service.start_server()
        host_url = f"http://127.0.0.1:{host_port}"
        client = openai.OpenAI(base_url=f"{service.url}/v1", api_key=TOKEN, max_retries=0, timeout=60)
        dataset = write_text_dataset(tmp / "train.jsonl", n=16)
        training_file = client.files.create(file=dataset.open("rb"), purpose="fine-tune")
        spec: dict[str, Any] = {
            "model": {"mixed_precision": "no"},
            "data": {"max_length": 32},
            "training": {"max_steps": 2, "batch_size": 4, "save_every": 1},
            "optimizer": {"lr": 1e-3},
        }
        created = {
            kind: client.fine_tuning.jobs.create(
                model=str(tiny_model_dir),
                training_file=training_file.id,
                suffix=kind,
                extra_body={"twinkle_spec": {**spec, "adapter": {"r": 4} if kind == "lora" else None}},
            )
            for kind in ("full", "lora")
        }
        _wait_healthy(host_url, service.data_dir / "serve.log", host)
        jobs = {}
        for kind, job in created.items():
            native = service.wait_terminal(job.id, timeout=240)
            assert native["status"] == "succeeded", service.worker_log()
            jobs[kind] = client.fine_tuning.jobs.retrieve(job.id)
        yield Stack(service, client, host_url, jobs, str(tiny_model_dir))
    finally:
        service.stop()


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_chat_with_the_fine_tuned_model_plain_and_streamed(stack: Stack, kind: str) -> None:
    job = stack.jobs[kind]
    assert job.fine_tuned_model == f"ft:{Path(stack.base_model).name}:{kind}:{job.id}"
    plain = stack.client.chat.completions.create(
        model=job.fine_tuned_model,
        messages=PROMPT,
        max_tokens=8,
        temperature=0,
    )
    assert plain.object == "chat.completion" and plain.model == job.fine_tuned_model
    choice = plain.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert plain.usage is not None and 0 < plain.usage.completion_tokens <= 8

    chunks = list(
        stack.client.chat.completions.create(
            model=job.fine_tuned_model,
            messages=PROMPT,
            max_tokens=8,
            temperature=0,
            stream=True,
        )
    )
    assert all(c.object == "chat.completion.chunk" and c.model == job.fine_tuned_model for c in chunks)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == choice.message.content  # greedy: the stream is the same answer, token by token
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason


def test_completions_on_a_checkpoint_and_the_model_list(stack: Stack) -> None:
    lora = stack.jobs["lora"]
    checkpoints = stack.client.fine_tuning.jobs.checkpoints.list(lora.id).data
    assert [c.step_number for c in checkpoints] == [2, 1]
    first = checkpoints[-1].fine_tuned_model_checkpoint
    assert first == f"{lora.id}:ckpt-1"
    answer = stack.client.completions.create(model=first, prompt="the cat", max_tokens=4, temperature=0)
    assert answer.object == "text_completion" and answer.model == first
    assert isinstance(answer.choices[0].text, str) and answer.usage is not None

    with pytest.raises(openai.NotFoundError) as missing:
        stack.client.completions.create(model=f"{lora.id}:ckpt-9", prompt="x", max_tokens=1)
    assert missing.value.body["param"] == "model"  # type: ignore[index]

    with pytest.raises(openai.BadRequestError) as too_long:  # the tiny model's context is 256 tokens
        stack.client.completions.create(model=first, prompt="the cat", max_tokens=300)
    assert too_long.value.body["param"] == "prompt"  # type: ignore[index]

    ids = [m.id for m in stack.client.models.list()]
    assert set(ids) == {stack.jobs["full"].fine_tuned_model, lora.fine_tuned_model, stack.base_model}


def test_a_client_leaving_mid_stream_frees_the_host_slot(stack: Stack) -> None:
    model = stack.jobs["full"].fine_tuned_model
    assert model is not None
    began = time.monotonic()
    whole = stack.client.chat.completions.create(
        model=model,
        messages=PROMPT,
        max_tokens=230,  # the tiny model's context is 256
        n=4,  # a longer generation to cut short
        temperature=1.0,
        seed=3,
    )
    generating = time.monotonic() - began  # what the same request costs when nobody leaves
    assert whole.usage is not None and whole.usage.completion_tokens >= 400  # a long answer to cut short

    stream = stack.client.chat.completions.create(
        model=model,
        messages=PROMPT,
        max_tokens=230,  # the tiny model's context is 256
        n=4,  # a longer generation to cut short
        temperature=1.0,
        seed=3,
        stream=True,
    )
    next(iter(stream))
    assert stack.host_health()["slots"]["busy"] == 1
    stream.close()  # the client goes away; the server closes its request to the host
    left = time.monotonic()
    while stack.host_health()["slots"]["busy"] and time.monotonic() - left < generating:
        time.sleep(0.02)
    freed = time.monotonic() - left
    assert stack.host_health()["slots"]["busy"] == 0
    # Freed by the disconnect, not by the generation running out: well before the whole answer.
    assert freed < generating / 2, (freed, generating)
    print(f"slot freed {freed:.2f} s after the client left; the whole answer takes {generating:.2f} s")
    again = stack.client.chat.completions.create(model=model, messages=PROMPT, max_tokens=2)
    assert again.choices[0].finish_reason in ("stop", "length")


def test_a_checkpoint_whose_files_are_gone_is_a_404_naming_model(stack: Stack) -> None:
    full = stack.jobs["full"]
    shutil.rmtree(stack.service.data_dir / "jobs" / full.id / "checkpoints" / "step-1")
    with pytest.raises(openai.NotFoundError) as gone:  # the row is there; the host finds no files
        stack.client.completions.create(model=f"{full.id}:ckpt-1", prompt="x", max_tokens=1)
    assert gone.value.body["param"] == "model"  # type: ignore[index]
