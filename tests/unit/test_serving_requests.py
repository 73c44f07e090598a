"""What the serving host checks before it generates: the checkpoint and base paths of the
`twinkle` key, the request's options and length against the context, and the slots."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from serving.engine import Engine, Limits
from serving.errors import Forbidden, InvalidRequest, InvalidValue, NotFound, Unavailable
from serving.loading import LoadedModel
from serving.protocol import ChatRequest, CompletionRequest
from serving.sampling import SamplingParams
from serving.targets import Target, TwinkleKey, check_target


def _checkpoint(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "COMPLETE").write_text("ok\n")
    return path


def _key(checkpoint: Path | str, base: str | None = None) -> TwinkleKey:
    return TwinkleKey(checkpoint=str(checkpoint), base_model=base, model="m")


def test_a_complete_checkpoint_under_the_jobs_root_is_served(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    ckpt = _checkpoint(jobs / "job-1" / "checkpoints" / "step-2")
    target = check_target(_key(ckpt, "org/name"), jobs, [])
    assert target.checkpoint == ckpt.resolve() and target.key == str(ckpt) and target.base_model == "org/name"


def test_paths_outside_the_roots_are_refused_before_anything_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = tmp_path / "jobs"
    inside = _checkpoint(jobs / "job-1" / "checkpoints" / "step-2")
    outside = _checkpoint(tmp_path / "elsewhere" / "step-1")
    (jobs / "job-link").symlink_to(outside.parent, target_is_directory=True)
    for path in (outside, jobs / "job-link" / "step-1", jobs / ".." / "elsewhere" / "step-1"):
        with pytest.raises(Forbidden) as caught:
            check_target(_key(path), jobs, [])
        assert caught.value.param == "twinkle.checkpoint"
    with pytest.raises(InvalidValue):
        check_target(_key("jobs/job-1/checkpoints/step-2"), jobs, [])
    (inside / "COMPLETE").unlink()
    with pytest.raises(NotFound):  # written but not complete
        check_target(_key(inside), jobs, [])
    _checkpoint(jobs / "job-2" / "step-1")
    models = tmp_path / "models" / "base"
    models.mkdir(parents=True)
    with pytest.raises(Forbidden) as caught:
        check_target(_key(jobs / "job-2" / "step-1", str(models)), jobs, [])
    assert caught.value.param == "twinkle.base_model"
    assert check_target(_key(jobs / "job-2" / "step-1", str(models)), jobs, [tmp_path / "models"]).base_model
    # A base that leads into the jobs root (another job's weights) or another of the service's
    # folders (the vLLM backend's merged copies), even under an allowed root:
    merged = tmp_path / "serving" / "merged" / "abc"
    merged.mkdir(parents=True)
    (tmp_path / "models" / "swapped").symlink_to(jobs / "job-1", target_is_directory=True)
    (tmp_path / "models" / "to-merged").symlink_to(merged, target_is_directory=True)
    roots, owned = [tmp_path, tmp_path / "models"], [tmp_path / "serving"]
    for base in (jobs / "job-1", tmp_path / "models" / "swapped", tmp_path / "models" / "to-merged"):
        with pytest.raises(Forbidden) as caught:
            check_target(_key(jobs / "job-2" / "step-1", str(base)), jobs, roots, owned)
        assert caught.value.param == "twinkle.base_model"
    # A hub id is a name whatever exists under that name here.
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert (
        check_target(_key(jobs / "job-2" / "step-1", "org/name"), jobs, roots, owned).base_model == "org/name"
    )
    with pytest.raises(InvalidValue) as refused:  # expanduser raises for an unknown user
        check_target(_key(jobs / "job-2" / "step-1", "~no-such-user-of-this-machine/base"), jobs, [])
    assert refused.value.param == "twinkle.base_model"


def _chat(**fields: Any) -> ChatRequest:
    return ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "twinkle": _key("/x"), **fields}
    )


def test_max_tokens_must_fit_the_context_and_defaults_to_what_is_left() -> None:
    assert _chat().sampling(100, 256, param="messages", default=None).max_tokens == 156
    assert _chat(max_completion_tokens=10).sampling(100, 256, param="messages", default=None).max_tokens == 10
    for request, prompt in ((_chat(max_tokens=157), 100), (_chat(), 256)):
        with pytest.raises(InvalidRequest) as caught:
            request.sampling(prompt, 256, param="messages", default=None)
        assert caught.value.code == "context_length_exceeded" and caught.value.param == "messages"
    completion = CompletionRequest.model_validate({"model": "m", "prompt": "a", "twinkle": _key("/x")})
    assert completion.sampling(250, 256, param="prompt", default=16).max_tokens == 6  # 16, capped


def test_options_the_host_cannot_honour_are_refused_by_name_and_harmless_ones_pass() -> None:
    _chat(
        user="me", logprobs=False, presence_penalty=0, response_format={"type": "text"}
    ).refuse_unsupported()
    for field, value in (("logprobs", True), ("tools", [{"type": "function"}]), ("frequency_penalty", 0.5)):
        with pytest.raises(InvalidRequest) as caught:
            _chat(**{field: value}).refuse_unsupported()
        assert caught.value.param == field and caught.value.code == "unsupported_parameter"


class _Held:
    """A generation that runs until cancelled."""

    def __init__(self) -> None:
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def cancel(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    async def __aiter__(self) -> Any:
        await self.finished
        return
        yield


class _Backend:
    name = "fake"

    def default_memory_bytes(self) -> int:
        return 1

    def estimate_bytes(self, target: Target) -> int:
        return 1

    def load(self, target: Target) -> LoadedModel:
        raise AssertionError("not used here")

    def start(self, loaded: LoadedModel, prompts: list[list[int]], params: SamplingParams) -> _Held:
        return _Held()

    def release(self, loaded: LoadedModel) -> None:
        pass


def test_a_request_waits_for_a_slot_then_gets_503_and_a_cancel_frees_one() -> None:
    async def scenario() -> None:
        limits = Limits(memory_bytes=1, load_timeout=1, slots=1, slot_timeout=0.05)
        engine = Engine(_Backend(), limits)
        model = LoadedModel(Target("k", Path("/k"), None, "m"), None, 16, 1, None)
        params = SamplingParams(max_tokens=1)
        first = await engine.start(model, [[1]], params)
        assert engine.busy == 1
        with pytest.raises(Unavailable) as caught:
            await engine.start(model, [[1]], params)
        assert caught.value.code == "no_free_slot" and caught.value.headers["Retry-After"] == "1"
        first.cancel()
        await asyncio.sleep(0)
        second = await engine.start(model, [[1]], params)
        assert engine.busy == 1
        second.cancel()
        await asyncio.sleep(0)
        assert engine.busy == 0

    asyncio.run(scenario())
