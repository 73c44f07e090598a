"""The serving host against real tiny checkpoints (full and LoRA, trained in-process by
twinkle_core), over real HTTP, spoken to by the official `openai` package as the API server's
relay passes it on: the OpenAI answer shapes, plain and streamed; greedy output equal to plain
`model.generate`; same seed same text; stop sequences; a cancelled stream freeing its slot; 400
over the context; 401 without the secret; the jobs-root check."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving_host import SECRET, build_long_context_model, make_checkpoint, running_host, twinkle_key

openai = pytest.importorskip("openai")


class Host:
    def __init__(self, url: str, full: Path, lora: Path, base: Path, jobs_root: Path) -> None:
        self.url, self.full, self.lora, self.base, self.jobs_root = url, full, lora, base, jobs_root
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key=SECRET, max_retries=0, timeout=120)

    def key(self, which: str) -> dict[str, Any]:
        if which == "lora":
            return {"twinkle": twinkle_key(self.lora, "ft:lora", self.base)}
        return {"twinkle": twinkle_key(self.full, "ft:full")}

    def lora_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.lora))

    def health(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/healthz", headers={"Authorization": f"Bearer {SECRET}"})
        return dict(response.json())


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Host]:
    from serving.app import create_app
    from serving.engine import Engine, Limits
    from serving.generation import TransformersBackend

    root = tmp_path_factory.mktemp("serving")
    base = build_long_context_model(root / "models" / "tiny-long", tiny_model_dir)
    jobs_root = root / "jobs"
    full = make_checkpoint(base, jobs_root, "job-full", lora=False)
    lora = make_checkpoint(base, jobs_root, "job-lora", lora=True)
    # One slot: the cancel test needs the next request to depend on the slot it frees.
    limits = Limits(memory_bytes=2**30, load_timeout=60, slots=1, slot_timeout=5)
    engine = Engine(TransformersBackend(), limits)
    app = create_app(engine, secret=SECRET, jobs_root=jobs_root, allowed_roots=[root / "models"])
    with running_host(app) as url:
        yield Host(url, full, lora, base, jobs_root)


@pytest.mark.parametrize("which", ["full", "lora"])
def test_chat_answers_as_openai_plain_and_streamed(host: Host, which: str) -> None:
    messages = [{"role": "user", "content": "Who builds things?"}]
    args: dict[str, Any] = {"model": f"ft:{which}", "messages": messages, "max_tokens": 12, "seed": 7, "n": 2}
    answer = host.client.chat.completions.create(**args, extra_body=host.key(which))
    assert answer.object == "chat.completion" and answer.model == f"ft:{which}"
    assert answer.id.startswith("chatcmpl-")
    assert [c.index for c in answer.choices] == [0, 1]
    for choice in answer.choices:
        assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
        assert choice.finish_reason in ("stop", "length")
    assert answer.usage is not None and answer.usage.prompt_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens

    stream = host.client.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}, extra_body=host.key(which)
    )
    texts, finish, roles, usage = ["", ""], [None, None], set(), None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk" and chunk.id.startswith("chatcmpl-")
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            roles.add(choice.delta.role)
            texts[choice.index] += choice.delta.content or ""
            finish[choice.index] = choice.finish_reason or finish[choice.index]
    # Same seed, same request: the stream says what the whole answer said, token for token.
    assert texts == [c.message.content for c in answer.choices]
    assert finish == [c.finish_reason for c in answer.choices]
    assert "assistant" in roles
    assert usage is not None and usage.completion_tokens == answer.usage.completion_tokens


def test_completions_answer_as_openai_plain_and_streamed(host: Host) -> None:
    args: dict[str, Any] = {"model": "ft:full", "prompt": ["the cat", "a robot"], "max_tokens": 6, "seed": 3}
    answer = host.client.completions.create(**args, extra_body=host.key("full"))
    assert answer.object == "text_completion" and answer.id.startswith("cmpl-")
    assert [c.index for c in answer.choices] == [0, 1]
    assert all(c.finish_reason == "length" for c in answer.choices)  # no EOS in 6 tokens here
    assert answer.usage is not None and answer.usage.completion_tokens == 12
    streamed = ["", ""]
    for chunk in host.client.completions.create(**args, stream=True, extra_body=host.key("full")):
        assert chunk.object == "text_completion"
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == [c.text for c in answer.choices]


def test_each_answer_is_logged_once_as_it_ends(host: Host, caplog: pytest.LogCaptureFixture) -> None:
    # The host runs without uvicorn's access log; this line is what it says of each answer.
    def lines_for(answer_id: str) -> list[str]:
        messages = [r.getMessage() for r in caplog.records if r.name == "serving.answers"]
        return [message for message in messages if message.startswith(answer_id)]

    caplog.set_level("INFO", logger="serving.answers")
    args: dict[str, Any] = {
        "model": "ft:full",
        "prompt": "the cat",
        "extra_body": {**host.key("full"), "ignore_eos": True},
    }
    whole = host.client.completions.create(**args, max_tokens=5, n=2)
    assert whole.usage is not None
    [line] = lines_for(whole.id)
    assert line.startswith(
        f"{whole.id} for ft:full (whole): {whole.usage.prompt_tokens} prompt + 10 completion tokens, "
        "finish_reason length, "
    )
    assert line.endswith(" s")

    stream = host.client.completions.create(**args, max_tokens=4000, stream=True)
    streamed_id = next(iter(stream)).id
    stream.close()  # the client leaves after the first chunk: the answer is cut short
    deadline = time.monotonic() + 10
    while not lines_for(streamed_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    [line] = lines_for(streamed_id)
    assert "(streamed)" in line and "finish_reason none" in line


def test_prompts_given_as_token_ids_answer_as_their_text(host: Host) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(host.full))
    cat, robot = (list(tokenizer(text)["input_ids"]) for text in ("the cat", "a robot"))
    common: dict[str, Any] = {
        "model": "ft:full",
        "max_tokens": 6,
        "temperature": 0,
        "extra_body": host.key("full"),
    }
    by_text = host.client.completions.create(prompt=["the cat", "a robot"], **common)
    one = host.client.completions.create(prompt=cat, **common)
    several = host.client.completions.create(prompt=[cat, robot], **common)
    assert [c.text for c in several.choices] == [c.text for c in by_text.choices]
    assert one.choices[0].text == by_text.choices[0].text
    assert one.usage is not None and one.usage.prompt_tokens == len(cat)
    with pytest.raises(openai.BadRequestError) as caught:
        host.client.completions.create(prompt=[cat, [len(tokenizer)]], **common)
    assert caught.value.body["param"] == "prompt.1"  # type: ignore[index]
    assert "vocabulary" in caught.value.body["message"]  # type: ignore[index]


def _plain_greedy(checkpoint: Path, prompt: str, max_new_tokens: int, base: Path | None = None) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    if base is None:
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    else:
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)), str(checkpoint))
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    # eos_token_id=[]: no EOS at all (None would mean the model's own).
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=[], pad_token_id=0)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


@pytest.mark.parametrize("which", ["full", "lora"])
def test_greedy_is_plain_generate_and_stop_cuts_there(host: Host, which: str) -> None:
    checkpoint, base = (host.lora, host.base) if which == "lora" else (host.full, None)
    expected = _plain_greedy(checkpoint, "the cat", 10, base)
    common: dict[str, Any] = {"model": f"ft:{which}", "prompt": "the cat", "temperature": 0}
    extra = {**host.key(which), "ignore_eos": True}
    answer = host.client.completions.create(**common, max_tokens=10, extra_body=extra)
    assert answer.choices[0].text == expected and answer.choices[0].finish_reason == "length"
    # A stop sequence taken from the middle of that text ends the answer just before it.
    stop = expected[len(expected) // 2 : len(expected) // 2 + 2]
    stopped = host.client.completions.create(**common, max_tokens=10, stop=[stop], extra_body=extra)
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == expected[: expected.index(stop)]


def test_a_lora_base_is_built_as_the_job_built_it(host: Host) -> None:
    # A job that changed its base through a config override (and named the model class): its
    # adapter is merged into that changed base, not into the stored one.
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    override = {"rms_norm_eps": 0.5}
    checkpoint = make_checkpoint(host.base, host.jobs_root, "job-lora-config", lora=True, config=override)
    config = AutoConfig.from_pretrained(str(host.base), **override)
    trained_on = AutoModelForCausalLM.from_pretrained(str(host.base), config=config)
    model = PeftModel.from_pretrained(trained_on, str(checkpoint))
    tokenizer = host.lora_tokenizer()
    ids = tokenizer("the cat", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=[], pad_token_id=0)
    expected = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert expected != _plain_greedy(checkpoint, "the cat", 12, host.base)  # the override matters

    key = twinkle_key(
        checkpoint, "ft:lora-config", host.base, base_model_cls="LlamaForCausalLM", base_config=override
    )
    answer = host.client.completions.create(
        model="ft:lora-config",
        prompt="the cat",
        temperature=0,
        max_tokens=12,
        extra_body={"twinkle": key, "ignore_eos": True},
    )
    assert answer.choices[0].text == expected


def test_same_seed_same_text_other_seed_other_text(host: Host) -> None:
    def sample(seed: int) -> list[str]:
        answer = host.client.completions.create(
            model="ft:full", prompt="the cat", max_tokens=16, seed=seed, n=3, temperature=1.0,
            extra_body={**host.key("full"), "ignore_eos": True},
        )  # fmt: skip
        return [c.text for c in answer.choices]

    first = sample(11)
    assert sample(11) == first
    assert len(set(first)) == 3  # n choices are independent draws
    assert sample(12) != first


def test_ignore_eos_generates_max_tokens_where_eos_would_end_choices(host: Host) -> None:
    args: dict[str, Any] = {"model": "ft:full", "prompt": "the cat", "max_tokens": 300, "n": 4, "seed": 1}
    stopping = host.client.completions.create(**args, extra_body=host.key("full"))
    assert "stop" in [c.finish_reason for c in stopping.choices]  # this seed draws an EOS
    going_on = host.client.completions.create(**args, extra_body={**host.key("full"), "ignore_eos": True})
    assert [c.finish_reason for c in going_on.choices] == ["length"] * 4
    assert going_on.usage is not None and going_on.usage.completion_tokens == 1200


def test_a_cancelled_stream_frees_its_slot(host: Host) -> None:
    # 4000 tokens take this model tens of seconds; the only slot must come back within the next
    # request's slot timeout (5 s), which only the cancel can do.
    body = {
        "model": "ft:full",
        "prompt": "the cat",
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
        **host.key("full"),
    }
    headers = {"Authorization": f"Bearer {SECRET}"}
    with httpx.stream(
        "POST", f"{host.url}/v1/completions", json=body, headers=headers, timeout=60
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert host.health()["slots"]["busy"] == 1
    started = time.monotonic()
    answer = host.client.completions.create(
        model="ft:full", prompt="a robot", max_tokens=4, extra_body=host.key("full")
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert time.monotonic() - started < 5
    assert host.health()["slots"]["busy"] == 0


def test_a_client_that_leaves_a_whole_answer_frees_its_slot_too(host: Host) -> None:
    body = {
        "model": "ft:full",
        "prompt": "the cat",
        "max_tokens": 4000,
        "ignore_eos": True,
        **host.key("full"),
    }
    headers = {"Authorization": f"Bearer {SECRET}"}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up long before 4000 tokens
        httpx.post(f"{host.url}/v1/completions", json=body, headers=headers, timeout=1.0)
    answer = host.client.completions.create(
        model="ft:full", prompt="a", max_tokens=2, extra_body=host.key("full")
    )
    assert answer.choices[0].text is not None
    assert host.health()["slots"]["busy"] == 0


def test_over_the_context_is_400_naming_the_field(host: Host) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        host.client.completions.create(
            model="ft:full", prompt="the cat", max_tokens=5000, extra_body=host.key("full")
        )
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as caught:
        host.client.chat.completions.create(
            model="ft:full",
            messages=[{"role": "user", "content": "the cat " * 3000}],
            extra_body=host.key("full"),
        )
    assert caught.value.body["param"] == "messages"


def test_the_secret_and_the_jobs_root_are_checked(host: Host, tmp_path: Path) -> None:
    body = {"model": "ft:full", "prompt": "the cat", "max_tokens": 2, **host.key("full")}
    assert httpx.post(f"{host.url}/v1/completions", json=body).status_code == 401
    wrong = httpx.post(f"{host.url}/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{host.url}/healthz").json() == {"status": "ok"}  # nothing loaded is told
    outside = tmp_path / "step-1"
    outside.mkdir()
    (outside / "COMPLETE").write_text("ok\n")
    escape = host.jobs_root / "job-escape"
    escape.symlink_to(tmp_path, target_is_directory=True)  # inside by name, outside in fact
    for path in (outside, escape / "step-1"):
        with pytest.raises(openai.PermissionDeniedError) as caught:
            host.client.completions.create(
                model="x", prompt="a", extra_body={"twinkle": twinkle_key(path, "x")}
            )
        assert caught.value.body["param"] == "twinkle.checkpoint"
    with pytest.raises(openai.NotFoundError):  # inside, but not a complete checkpoint
        host.client.completions.create(
            model="x", prompt="a", extra_body={"twinkle": twinkle_key(host.jobs_root / "job-full", "x")}
        )


def test_a_bad_body_is_400_naming_the_field_and_only_after_the_secret(host: Host) -> None:
    headers = {"Authorization": f"Bearer {SECRET}"}
    body = {"model": "ft:full", "prompt": "the cat", "temperature": 5, **host.key("full")}
    chat = {**body, "messages": [{"role": "user", "content": "hi"}]}
    for path, sent in (("/v1/completions", body), ("/v1/chat/completions", chat)):
        answer = httpx.post(f"{host.url}{path}", json=sent, headers=headers)
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["code"] == "invalid_value"  # as OpenAI's
        assert error["param"] == "temperature" and "temperature" in error["message"]
        # The secret is checked before the body is read.
        assert httpx.post(f"{host.url}{path}", json=sent).status_code == 401
    missing = httpx.post(f"{host.url}/v1/completions", json={"model": "x", "prompt": "a"}, headers=headers)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "twinkle"
    broken = httpx.post(f"{host.url}/v1/completions", content=b"{not json", headers=headers)
    assert broken.status_code == 400 and broken.json()["error"]["param"] is None


def _engine(memory_bytes: int, load_timeout: float) -> Any:
    from serving.engine import Engine, Limits
    from serving.generation import TransformersBackend

    limits = Limits(memory_bytes=memory_bytes, load_timeout=load_timeout, slots=1, slot_timeout=5)
    return Engine(TransformersBackend(), limits)


def test_the_cache_keeps_within_its_bound_evicting_the_least_recently_used(host: Host) -> None:
    import asyncio
    import shutil

    from serving.targets import TwinkleKey, check_target

    third = host.jobs_root / "job-third" / "checkpoints" / "step-2"
    shutil.copytree(host.full, third)
    keys = {
        "full": twinkle_key(host.full, "ft:full"),
        "lora": twinkle_key(host.lora, "ft:lora", host.base),
        "third": twinkle_key(third, "ft:third"),
    }
    targets = {
        name: check_target(TwinkleKey(**key), host.jobs_root, [host.base.parent])
        for name, key in keys.items()
    }

    async def scenario() -> list[list[str]]:
        one = await _engine(2**40, 60).model(targets["full"])
        engine = _engine(2 * one.bytes, 60)  # room for two of these models
        seen = []
        for name in ("full", "lora", "full", "third"):
            await engine.model(targets[name])
            seen.append([m["model"] for m in engine.cache.loaded()])
            assert engine.cache.loaded_bytes <= 2 * one.bytes
        return seen

    seen = asyncio.run(scenario())
    # Most recently used first; the third model pushes out the LoRA, used less recently than full.
    assert seen == [["ft:full"], ["ft:lora", "ft:full"], ["ft:full", "ft:lora"], ["ft:third", "ft:full"]]


def test_a_load_that_outlasts_the_timeout_is_503_with_retry_after_and_goes_on(host: Host) -> None:
    import asyncio

    from serving.app import create_app

    engine = _engine(2**30, 0.0)  # nothing loads in no time
    app = create_app(engine, secret=SECRET, jobs_root=host.jobs_root, allowed_roots=[host.base.parent])
    body = {"model": "ft:full", "prompt": "the cat", "max_tokens": 2, **host.key("full")}

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {SECRET}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://host", headers=headers) as client:
            first = await client.post("/v1/completions", json=body)
            for _ in range(600):  # the load goes on without anyone waiting
                if engine.cache.loaded():
                    break
                await asyncio.sleep(0.05)
            return first, await client.post("/v1/completions", json=body)

    first, later = asyncio.run(scenario())
    assert first.status_code == 503 and int(first.headers["Retry-After"]) >= 1
    assert first.json()["error"]["code"] == "model_loading"
    assert later.status_code == 200 and later.json()["choices"][0]["finish_reason"] in ("stop", "length")
