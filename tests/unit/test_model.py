"""TransformersModel in one process: arguments, errors, loss normalisation, save/restore, export.

Multi-rank behaviour (DDP, FSDP2, HSDP, exact resume) is in tests/integration/test_model_distributed.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from twinkle_core import DeviceMesh
from twinkle_core.mesh import DeviceMesh as MeshClass
from twinkle_core.model import TransformersModel, strategies
from twinkle_core.model.distributed import DistInfo
from twinkle_core.model.strategies import AccelerateStrategy, NativeFSDPStrategy, make_strategy


def _model(model_dir: Path, **kwargs: Any) -> TransformersModel:
    torch.manual_seed(0)
    kwargs.setdefault("mixed_precision", "no")
    return TransformersModel(model_id=str(model_dir), **kwargs)


def _batch(model: TransformersModel, texts: list[str]) -> dict[str, torch.Tensor]:
    encoded = model.tokenizer(texts, padding=True, return_tensors="pt")
    labels = encoded["input_ids"].clone()
    labels[encoded["attention_mask"] == 0] = -100
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "labels": labels}


TEXTS = [
    "the cat likes small boats.",
    "a robot builds long books and old maps.",
    "our team reads.",
    "a bird finds",
]


# ------------------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mixed_precision": "fp9"}, "mixed_precision must be one of"),
        ({"mixed_precision": "fp8"}, "fp8.*needs a CUDA GPU"),
        ({"strategy": "deepspeed"}, "strategy must be 'accelerate' or 'native_fsdp'"),
        ({"model_cls": "NoSuchModelClass"}, "model_cls 'NoSuchModelClass'"),
        ({"model_cls": 3}, "model_cls must be"),
        ({"device_mesh": DeviceMesh(dp_size=2)}, "must equal the world size"),
        ({"device_mesh": {"dp_size": 1}}, "device_mesh must be a twinkle.DeviceMesh"),
        ({"ddp_config": {"no_such_option": 1}}, "ddp_config"),
        ({"ddp_config": "find_unused"}, "ddp_config must be a dict"),
        ({"fsdp_config": {"reshard_after_forward": True}}, "fsdp_config applies only when"),
        ({"grad_scaler_config": {"init_scale": 2.0}}, "grad_scaler_config applies to mixed_precision='fp16'"),
        ({"mixed_precision": "fp16", "grad_scaler_config": {"bogus": 1}}, "grad_scaler_config"),
        ({"memory_efficient_init": True}, "memory_efficient_init needs strategy='native_fsdp'"),
        ({"config": {"hiden_size": 32}}, r"config: \['hiden_size'\] are not fields"),
        ({"config": ["hidden_size"]}, "config must be a PretrainedConfig or a dict"),
        ({"no_such_from_pretrained_kwarg": 1}, "kwargs rejected|no_such_from_pretrained_kwarg"),
    ],
)
def test_invalid_arguments_fail_with_a_clear_message(
    tiny_model_dir: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        _model(tiny_model_dir, **kwargs)


def test_model_id_and_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs model_id or config"):
        TransformersModel(mixed_precision="no")
    with pytest.raises(ValueError, match="must name its model_type"):
        TransformersModel(config={"hidden_size": 64}, mixed_precision="no")
    with pytest.raises(ValueError, match="does not exist"):
        TransformersModel(model_id=str(tmp_path / "missing"), mixed_precision="no")
    with pytest.raises(ValueError, match="expected hf://org/name"):
        TransformersModel(model_id="hf://just-a-name", mixed_precision="no")


def _info(world: int = 2) -> DistInfo:
    return DistInfo(rank=0, local_rank=0, world_size=world, device=torch.device("cpu"))


def test_accelerate_itself_never_shards_on_cpu() -> None:
    # accelerate would silently run DDP instead of sharding; built directly, it refuses.
    with pytest.raises(ValueError, match="accelerate cannot shard on CPU"):
        AccelerateStrategy(MeshClass(dp_size=1, fsdp_size=2), _info(), "no", {}, {}, False)


@pytest.mark.parametrize(
    ("dp", "fsdp", "layout"), [(1, 2, "sharded (fsdp 2)"), (2, 2, "hybrid sharding (dp 2 x fsdp 2)")]
)
def test_default_strategy_shards_natively_on_cpu(
    dp: int, fsdp: int, layout: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The seed's default strategy with an FSDP mesh: sharded through native FSDP2 on CPU, under the
    # name the user asked for, and said once at WARNING (visible without any logging set-up).
    monkeypatch.setattr(strategies, "_logged", set())  # "once" is per process: start afresh
    mesh = MeshClass(dp_size=dp, fsdp_size=fsdp)
    with caplog.at_level("INFO", logger="twinkle_core.model.strategies"):
        for _ in range(2):
            strategy = make_strategy("accelerate", mesh, _info(dp * fsdp), "bf16", None, None, False)
    assert isinstance(strategy, NativeFSDPStrategy) and strategy.sharded
    assert strategy.name == "accelerate" and strategy.mesh == mesh
    messages = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert messages == [
        f"strategy='accelerate' runs as native FSDP2 (fully_shard), {layout}, because accelerate cannot "
        "shard on CPU"
    ]


def test_default_strategy_on_cpu_takes_only_the_fsdp_config_it_can_honour() -> None:
    mesh = MeshClass(dp_size=1, fsdp_size=2)
    with pytest.raises(ValueError, match=r"fsdp_config: \['auto_wrap_policy'\] cannot be honoured on CPU"):
        make_strategy("accelerate", mesh, _info(), "no", None, {"auto_wrap_policy": "x"}, False)
    with pytest.raises(ValueError, match="ddp_config applies to DDP"):
        make_strategy("accelerate", mesh, _info(), "no", {"bucket_cap_mb": 10}, None, False)
    strategy = make_strategy("accelerate", mesh, _info(), "no", None, {"reshard_after_forward": False}, False)
    assert isinstance(strategy, NativeFSDPStrategy) and strategy.reshard_after_forward is False


def test_accelerate_with_memory_efficient_init_is_refused_on_any_device() -> None:
    # One rule on CPU and GPU: the error names the strategy that supports it.
    for mesh in (MeshClass(dp_size=1, fsdp_size=2), MeshClass(dp_size=2, fsdp_size=1), MeshClass(2, 2)):
        with pytest.raises(ValueError, match="memory_efficient_init needs strategy='native_fsdp'"):
            make_strategy("accelerate", mesh, _info(mesh.world_size), "bf16", None, None, True)
        with pytest.raises(ValueError, match="memory_efficient_init needs strategy='native_fsdp'"):
            AccelerateStrategy(mesh, _info(mesh.world_size), "bf16", {}, {}, True)


def test_fp8_without_an_eligible_layer_is_an_error() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from twinkle_core.model.precision import check_fp8_layers

    def llama(hidden: int) -> torch.nn.Module:
        config = LlamaConfig(
            vocab_size=64,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
        with torch.device("meta"):
            return LlamaForCausalLM(config)

    # hidden 40: no projection has both dimensions divisible by 16, so nothing would run in fp8.
    with pytest.raises(ValueError, match="no linear layer of this model can run in fp8"):
        check_fp8_layers(llama(40))
    assert check_fp8_layers(llama(64)) == 7  # q, k, v, o, gate, up, down; lm_head stays bf16


def test_native_fsdp_config_is_checked() -> None:
    mesh = MeshClass(dp_size=1, fsdp_size=2)
    with pytest.raises(ValueError, match=r"unknown keys \['sharding_strategy'\]"):
        NativeFSDPStrategy(mesh, _info(), "no", {}, {"sharding_strategy": "FULL"}, False)
    with pytest.raises(ValueError, match="cpu_offload needs a GPU"):
        NativeFSDPStrategy(mesh, _info(), "no", {}, {"cpu_offload": True}, False)
    with pytest.raises(ValueError, match="ddp_config applies to strategy='accelerate'"):
        NativeFSDPStrategy(mesh, _info(), "no", {"bucket_cap_mb": 10}, {}, False)
    strategy = NativeFSDPStrategy(mesh, _info(), "bf16", {}, {"reshard_after_forward": False}, True)
    assert strategy.reshard_after_forward is False and strategy.memory_efficient_init
    # Unset: torch's default (None), where the root keeps its parameters after forward.
    assert NativeFSDPStrategy(mesh, _info(), "no", {}, {}, False).reshard_after_forward is None


def test_native_fsdp_keeps_only_the_roots_parameters_gathered_between_forward_and_backward() -> None:
    from torch.distributed.tensor import DTensor

    fields = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64}
    fields |= {"num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2}
    model = TransformersModel(config=fields, strategy="native_fsdp", mixed_precision="no")
    model.set_optimizer("adamw", lr=1e-3)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    wrapped = model.wrapped
    wrapped.train()
    loss = wrapped(input_ids=ids, labels=ids).loss
    # The backward needs the embeddings and the head first: they stay gathered (not DTensors);
    # a decoder layer's parameters go back to their shards until the backward reaches it.
    assert not isinstance(wrapped.model.embed_tokens.weight, DTensor)
    assert isinstance(wrapped.model.layers[0].mlp.up_proj.weight, DTensor)
    loss.backward()
    assert all(isinstance(p, DTensor) for p in wrapped.parameters())


def test_model_cls_as_class_auto_class_or_name(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    for model_cls in (LlamaForCausalLM, AutoModelForCausalLM, "LlamaForCausalLM", None):
        model = _model(tiny_model_dir, model_cls=model_cls)
        assert type(model.model).__name__ == "LlamaForCausalLM"


def test_config_overrides_the_stored_config_and_kwargs_reach_from_pretrained(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir, config={"attention_dropout": 0.25}, attn_implementation="eager")
    assert model.model.config.attention_dropout == 0.25
    assert model.model.config._attn_implementation == "eager"
    reference = _model(tiny_model_dir)
    # The override changes one field; the weights are still the stored ones.
    assert torch.equal(model.model.lm_head.weight, reference.model.lm_head.weight)


def test_config_alone_builds_a_fresh_model() -> None:
    from transformers import LlamaConfig

    fields = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64}
    fields |= {"num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2}
    model = TransformersModel(config=fields, mixed_precision="no")
    assert model.model.config.hidden_size == 32 and model.tokenizer is None
    as_object = TransformersModel(
        config=LlamaConfig(**{k: v for k, v in fields.items() if k != "model_type"})
    )
    assert as_object.model.config.num_hidden_layers == 1


# ------------------------------------------------------------------------------ hub ids
@pytest.fixture()
def fake_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model_dir: Path) -> list[tuple[str, str]]:
    """Replace the network download with a copy of the tiny model; records each call."""
    from twinkle_core import hub

    calls: list[tuple[str, str]] = []

    def download(hub_name: str, repo_id: str, local_dir: Path) -> None:
        calls.append((hub_name, repo_id))
        shutil.copytree(tiny_model_dir, local_dir, dirs_exist_ok=True)

    monkeypatch.setattr(hub, "download_snapshot", download)
    monkeypatch.setenv("TWINKLE_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("TWINKLE_DEFAULT_HUB", raising=False)
    return calls


def test_hub_ids_download_once_into_the_cache(fake_hub: list[tuple[str, str]], tmp_path: Path) -> None:
    first = TransformersModel(model_id="hf://org/tiny", mixed_precision="no")
    second = TransformersModel(model_id="hf://org/tiny", mixed_precision="no")
    assert fake_hub == [("hf", "org/tiny")]
    assert first.model_dir == second.model_dir == tmp_path / "hub-cache" / "hf" / "org--tiny"
    TransformersModel(model_id="ms://org/tiny", mixed_precision="no")
    TransformersModel(model_id="org/bare", mixed_precision="no")
    assert fake_hub[1:] == [("ms", "org/tiny"), ("hf", "org/bare")]


def test_bare_ids_follow_the_configured_default_hub(
    fake_hub: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TWINKLE_DEFAULT_HUB", "ms")
    TransformersModel(model_id="org/other", mixed_precision="no")
    assert fake_hub == [("ms", "org/other")]


def test_modelscope_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import builtins

    from twinkle_core import hub

    real_import = builtins.__import__

    def no_modelscope(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("modelscope"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_modelscope)
    with pytest.raises(ValueError, match="optional dependency modelscope"):
        hub.download_snapshot("ms", "org/name", tmp_path)


# ------------------------------------------------------------------------ training steps
def test_forward_backward_and_stepping_every_n_micro_batches(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    model.set_optimizer("adamw", lr=1e-3)
    results = []
    for text in TEXTS:
        out = model.forward_backward(inputs=_batch(model, [text]))
        assert out["num_tokens"] > 0 and out["loss"] > 0
        results.append(model.clip_grad_and_step(max_grad_norm=1.0, gradient_accumulation_steps=2))
    # Exactly every 2 micro-batches, starting with the first window (no off-by-one).
    assert [r is not None for r in results] == [False, True, False, True]
    assert model.cur_step == 2
    assert results[1] is not None and set(results[1]) == {"step", "loss", "grad_norm", "lr", "num_tokens"}


def test_accumulated_micro_batches_equal_one_big_batch(tiny_model_dir: Path) -> None:
    """Token-weighted: 4 micro-batches of different lengths == 1 batch of 4, for the weights."""
    # SGD: the update is linear in the gradient (Adam's first step is sign(g), which turns float
    # noise in near-zero gradients into lr-sized differences).
    big = _model(tiny_model_dir)
    big.set_optimizer("sgd", lr=1.0)
    big.forward_backward(inputs=_batch(big, TEXTS))
    big_result = big.clip_grad_and_step(max_grad_norm=None, gradient_accumulation_steps=1)
    small = _model(tiny_model_dir)
    small.set_optimizer("sgd", lr=1.0)
    for text in TEXTS:
        small.forward_backward(inputs=_batch(small, [text]))
        small_result = small.clip_grad_and_step(max_grad_norm=None, gradient_accumulation_steps=4)
    assert big_result is not None and small_result is not None
    assert abs(big_result["loss"] - small_result["loss"]) < 1e-6
    assert big_result["num_tokens"] == small_result["num_tokens"]
    for (name, a), b in zip(big.model.named_parameters(), small.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name


def test_methods_compose_like_clip_grad_and_step(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    model.set_optimizer("sgd", lr=0.1)
    model.set_lr_scheduler("linear", num_warmup_steps=0, num_training_steps=10)
    model.forward_backward(inputs=_batch(model, TEXTS[:2]))
    norm = model.clip_grad_norm(max_grad_norm=0.5)
    assert norm > 0.5
    clipped = torch.nn.utils.get_total_norm([p.grad for p in model.model.parameters() if p.grad is not None])
    assert float(clipped) == pytest.approx(0.5, rel=1e-4)
    model.step()
    model.zero_grad()
    assert model.cur_step == 1 and model.current_lr() == pytest.approx(0.09)
    assert all(p.grad is None for p in model.model.parameters())


def test_optimizer_and_scheduler_errors(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    with pytest.raises(ValueError, match="set_optimizer must come before set_lr_scheduler"):
        model.set_lr_scheduler("linear")
    with pytest.raises(ValueError, match=r"not a torch\.optim optimizer"):
        model.set_optimizer("lion")
    with pytest.raises(ValueError, match="optimizer arguments"):
        model.set_optimizer("adamw", lr=1e-3, no_such=1)
    model.set_optimizer(torch.optim.AdamW, lr=1e-3)
    with pytest.raises(ValueError, match="unknown scheduler"):
        model.set_lr_scheduler("wobbly")
    model.set_lr_scheduler(torch.optim.lr_scheduler.StepLR, step_size=1)
    with pytest.raises(ValueError, match="needs labels"):
        model.forward_backward(inputs={"input_ids": torch.ones(1, 4, dtype=torch.long)})


def test_upstream_keywords_optimizer_cls_and_scheduler_cls(tiny_model_dir: Path) -> None:
    # Upstream twinkle names them optimizer_cls= / scheduler_cls=; they choose, never reach the class.
    model = _model(tiny_model_dir)
    model.set_optimizer(optimizer_cls="SGD", lr=0.5)
    assert type(model.optimizer) is torch.optim.SGD and model.current_lr() == 0.5
    model.set_optimizer(optimizer_cls=torch.optim.AdamW, lr=1e-3)
    assert type(model.optimizer) is torch.optim.AdamW
    model.set_lr_scheduler(scheduler_cls="linear", num_warmup_steps=0, num_training_steps=4)
    assert model.lr_scheduler.get_last_lr() == [1e-3]
    model.set_lr_scheduler(scheduler_cls=torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    assert isinstance(model.lr_scheduler, torch.optim.lr_scheduler.StepLR)
    with pytest.raises(ValueError, match="optimizer: pass the class or name once"):
        model.set_optimizer("adamw", optimizer_cls="sgd")
    with pytest.raises(ValueError, match="scheduler: pass the class or name once"):
        model.set_lr_scheduler("cosine", scheduler_cls="linear")
    model.set_optimizer(lr=1e-3)  # neither: the defaults (adamw)
    assert type(model.optimizer) is torch.optim.AdamW


def test_fp16_without_scaler_config_gets_a_default_scaler(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir, mixed_precision="fp16")
    assert isinstance(model.grad_scaler, torch.amp.GradScaler)
    model.set_optimizer("adamw", lr=1e-3)
    model.forward_backward(inputs=_batch(model, TEXTS[:2]))
    assert model.clip_grad_and_step() is not None


# ---------------------------------------------------------------------- save and restore
def _train_steps(model: TransformersModel, steps: int, adapter: str | None = None) -> None:
    for i in range(steps):
        model.forward_backward(inputs=_batch(model, [TEXTS[i % 4], TEXTS[(i + 1) % 4]]), adapter_name=adapter)
        model.clip_grad_and_step(adapter_name=adapter)


def test_full_parameter_checkpoint_restores_through_model_id(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = _model(tiny_model_dir)
    model.set_optimizer("adamw", lr=1e-2)
    model.set_lr_scheduler("cosine", num_warmup_steps=1, num_training_steps=10)
    _train_steps(model, 3)
    path = model.save("ckpt", output_dir=tmp_path, save_optimizer=True, consumed_train_samples=6)
    state = json.loads((Path(path) / "trainer_state.json").read_text())
    assert state["cur_step"] == 3 and state["consumed_train_samples"] == 6 and state["seed"] == 0
    restored = _model(Path(path))
    plain = AutoModelForCausalLM.from_pretrained(path)
    for (name, trained), again, hf in zip(
        model.model.named_parameters(), restored.model.parameters(), plain.parameters(), strict=True
    ):
        assert torch.equal(trained, again) and torch.equal(trained, hf), name
    restored.set_optimizer("adamw", lr=1e-2)
    restored.set_lr_scheduler("cosine", num_warmup_steps=1, num_training_steps=10)
    progress = restored.resume_from_checkpoint(path)
    assert progress == {"cur_step": 3, "consumed_train_samples": 6, "gradient_accumulation_steps": 1}
    assert restored.current_lr() == pytest.approx(model.current_lr())
    _train_steps(model, 1)
    _train_steps(restored, 1)
    for a, b in zip(model.model.parameters(), restored.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_optimizer_saved_through_dcp_still_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Unsharded checkpoints hold the optimizer in optimizer.pt; those written before it, in DCP.
    from twinkle_core.model import state_io

    model = _model(tiny_model_dir)
    model.set_optimizer("adamw", lr=1e-2)
    _train_steps(model, 2)
    path = Path(model.save("ckpt", output_dir=tmp_path, save_optimizer=True))
    assert (path / "optimizer.pt").is_file() and not (path / "optimizer").exists()
    assert model.optimizer is not None
    state_io.save_optimizer(model.wrapped, model.optimizer, path / state_io.OPTIMIZER_DIR)
    (path / state_io.OPTIMIZER_FILE).unlink()
    restored = _model(tiny_model_dir)
    restored.set_optimizer("adamw", lr=1e-2)
    assert restored.resume_from_checkpoint(path)["cur_step"] == 2
    _train_steps(model, 1)
    _train_steps(restored, 1)
    for a, b in zip(model.model.parameters(), restored.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_resume_preconditions(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = _model(tiny_model_dir)
    model.set_optimizer("adamw", lr=1e-2)
    weights_only = model.save("weights", output_dir=tmp_path)
    full = model.save("full", output_dir=tmp_path, save_optimizer=True)
    fresh = _model(tiny_model_dir)
    assert fresh.resume_from_checkpoint(full, resume_only_model=True)["cur_step"] == 0
    with pytest.raises(ValueError, match="set_optimizer"):
        fresh.resume_from_checkpoint(full)
    fresh.set_optimizer("adamw", lr=1e-2)
    with pytest.raises(ValueError, match="no optimizer state"):
        fresh.resume_from_checkpoint(weights_only)
    state_file = Path(full) / "trainer_state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "world_size": 2}))
    with pytest.raises(ValueError, match="saved by 2 ranks and this job has 1"):
        fresh.resume_from_checkpoint(full)
    (Path(full) / "COMPLETE").unlink()
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        fresh.resume_from_checkpoint(full)


def test_lora_adapters_export_alone_or_merged(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM

    model = _model(tiny_model_dir)
    model.add_adapter_to_model("first", {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})
    model.add_adapter_to_model("second", LoraConfig(r=2, lora_alpha=4, target_modules=["v_proj", "o_proj"]))
    with pytest.raises(ValueError, match="already exists"):
        model.add_adapter_to_model("first", {"r": 4})
    model.set_optimizer("adamw", adapter_name="second", lr=1e-2)
    with pytest.raises(ValueError, match="add_adapter_to_model must come before"):
        model.add_adapter_to_model("third", {"r": 2})
    with pytest.raises(ValueError, match="train adapter 'first' in its own"):
        model.forward_backward(inputs=_batch(model, TEXTS[:1]), adapter_name="first")
    _train_steps(model, 3, adapter="second")
    batch = _batch(model, TEXTS)
    model.wrapped.eval()
    with torch.no_grad():
        expected = model.forward(batch, adapter_name="second")["logits"]

    adapter_dir = Path(model.export(tmp_path / "adapter", adapter_name="second"))
    assert (adapter_dir / "adapter_config.json").is_file() and (adapter_dir / "tokenizer.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    with_adapter = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    merged_dir = model.export(tmp_path / "merged", merged=True, adapter_name="second")
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        assert torch.allclose(with_adapter(**inputs).logits, expected, atol=1e-5)
        assert torch.allclose(merged(**inputs).logits, expected, atol=1e-4)

    # Resume restores the adapter's weights into a fresh model with the same adapters.
    saved = model.save("lora", output_dir=tmp_path, adapter_name="second", save_optimizer=True)
    fresh = _model(tiny_model_dir)
    fresh.add_adapter_to_model("first", {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})
    fresh.add_adapter_to_model("second", LoraConfig(r=2, lora_alpha=4, target_modules=["v_proj", "o_proj"]))
    fresh.set_optimizer("adamw", adapter_name="second", lr=1e-2)
    assert fresh.resume_from_checkpoint(saved, adapter_name="second")["cur_step"] == 3
    fresh.wrapped.eval()
    with torch.no_grad():
        assert torch.equal(fresh.forward(batch, adapter_name="second")["logits"], expected)
    with pytest.raises(ValueError, match="LoRA checkpoint"):
        _model(Path(saved))


# ------------------------------------------------------------------------- generation
def _reference_greedy(model: TransformersModel, text: str, max_new_tokens: int, special: bool) -> str:
    """transformers' own greedy `generate`, one prompt at a time (no padding)."""
    tok = model.tokenizer
    inputs = tok(text, return_tensors="pt", add_special_tokens=special)
    with torch.no_grad():
        out = model.model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id
        )
    return str(tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))


def test_generate_is_transformers_greedy_and_leaves_training_untouched(tiny_model_dir: Path) -> None:
    import random

    import numpy as np

    # Dropout in the config: generation must run in eval mode, and draw nothing from any RNG.
    model = _model(tiny_model_dir, config={"attention_dropout": 0.3})
    model.set_optimizer("adamw", lr=1e-2)
    _train_steps_from(model, 0, 2)
    prompts = ["the cat", "Question: what does a robot build? Answer:"]  # different lengths: padding
    rng = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    completions = model.generate(prompts, max_new_tokens=12)
    assert random.getstate() == rng[0] and np.array_equal(np.random.get_state()[1], rng[1])
    assert torch.equal(torch.get_rng_state(), rng[2])
    assert model.wrapped.training  # back in training mode
    assert completions == model.generate(prompts, max_new_tokens=12)
    model.wrapped.eval()
    assert completions == [_reference_greedy(model, p, 12, special=True) for p in prompts]
    model.wrapped.train()

    # chat=True: the prompt as a user message through the tokenizer's chat template.
    chat = model.generate(prompts[:1], max_new_tokens=8, chat=True)
    rendered = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompts[0]}], tokenize=False, add_generation_prompt=True
    )
    model.wrapped.eval()
    assert chat == [_reference_greedy(model, rendered, 8, special=False)]

    # A generated token that is an end-of-sequence id of the model's generation config ends it there.
    first = model.tokenizer(completions[0], add_special_tokens=False)["input_ids"][0]
    model.model.generation_config.eos_token_id = [model.tokenizer.eos_token_id, first]
    assert model.generate(prompts[:1], max_new_tokens=12) == [""]

    # Generating between steps changes nothing in training: the same weights as a run without it.
    weights = []
    for generate in (True, False):
        m = _model(tiny_model_dir, config={"attention_dropout": 0.3})
        m.set_optimizer("adamw", lr=1e-2)
        _train_steps_from(m, 0, 1)
        if generate:
            m.generate(prompts, max_new_tokens=4)
        weights.append(_next_step_weights(m, 1))
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_generate_with_a_lora_adapter_and_bad_arguments(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    model.add_adapter_to_model("default", {"r": 4, "lora_alpha": 8})
    model.set_optimizer("adamw", adapter_name="default", lr=5e-2)
    before = model.generate(["the cat"], max_new_tokens=6, adapter_name="default")
    _train_steps(model, 3, adapter="default")
    after = model.generate(["the cat"], max_new_tokens=6, adapter_name="default")
    assert before != after  # the adapter's weights are used
    for prompts, tokens, message in [
        ([], 4, "non-empty list of strings"),
        ("the cat", 4, "non-empty list of strings"),
        (["the cat"], 0, "max_new_tokens must be a positive integer"),
    ]:
        with pytest.raises(ValueError, match=message):
            model.generate(prompts, max_new_tokens=tokens)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="adapter_name 'nope' is unknown"):
        model.generate(["x"], adapter_name="nope")


# ------------------------------------------------------ RNG, scaler and marker on resume
def _next_step_weights(model: TransformersModel, step: int) -> dict[str, torch.Tensor]:
    _train_steps_from(model, step, 1)
    return {k: v.detach().clone() for k, v in model.model.state_dict().items()}


def _train_steps_from(model: TransformersModel, start: int, steps: int) -> None:
    for i in range(start, start + steps):
        model.forward_backward(inputs=_batch(model, [TEXTS[i % 4], TEXTS[(i + 1) % 4]]))
        model.clip_grad_and_step()


def test_resume_restores_the_rng_so_dropout_continues_bitwise(tiny_model_dir: Path, tmp_path: Path) -> None:
    """With dropout the next step depends on the RNG: without restoring it the masks differ."""
    dropout = {"config": {"attention_dropout": 0.3}}
    model = _model(tiny_model_dir, **dropout)
    model.set_optimizer("adamw", lr=1e-2)
    _train_steps_from(model, 0, 2)
    path = model.save("ckpt", output_dir=tmp_path, save_optimizer=True)
    expected = _next_step_weights(model, 2)
    fresh = _model(tiny_model_dir, **dropout)
    fresh.set_optimizer("adamw", lr=1e-2)
    torch.manual_seed(1234)  # this process's RNG is elsewhere, as in a new process
    fresh.resume_from_checkpoint(path)
    again = _next_step_weights(fresh, 2)
    assert all(torch.equal(expected[k], again[k]) for k in expected)


def test_resume_restores_the_grad_scaler(tiny_model_dir: Path, tmp_path: Path) -> None:
    # growth_interval=1: the scale changes at every step, so a fresh scaler would not match.
    fp16 = {"mixed_precision": "fp16", "grad_scaler_config": {"init_scale": 2.0**8, "growth_interval": 1}}
    model = _model(tiny_model_dir, **fp16)
    model.set_optimizer("adamw", lr=1e-3)
    _train_steps_from(model, 0, 3)
    assert model.grad_scaler.get_scale() != 2.0**8
    path = model.save("ckpt", output_dir=tmp_path, save_optimizer=True)
    fresh = _model(tiny_model_dir, **fp16)
    fresh.set_optimizer("adamw", lr=1e-3)
    fresh.resume_from_checkpoint(path)
    assert fresh.grad_scaler.get_scale() == model.grad_scaler.get_scale()
    assert fresh.grad_scaler.state_dict() == model.grad_scaler.state_dict()
    expected, again = _next_step_weights(model, 3), _next_step_weights(fresh, 3)
    assert all(torch.equal(expected[k], again[k]) for k in expected)
    assert fresh.grad_scaler.get_scale() == model.grad_scaler.get_scale()

    # fp16 from a checkpoint without scaler state (deleted here, or a bf16 run's): refused.
    (Path(path) / "scaler.pt").unlink()
    with pytest.raises(ValueError, match=r"has no scaler\.pt"):
        fresh.resume_from_checkpoint(path)


def test_incomplete_or_temporary_checkpoints_are_never_loaded(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = _model(tiny_model_dir)
    model.set_optimizer("adamw", lr=1e-3)
    path = Path(model.save("ckpt", output_dir=tmp_path, save_optimizer=True))
    temporary = tmp_path / ".tmp-step-3"
    shutil.copytree(path, temporary)
    pruned = tmp_path / "half-pruned"  # trainer_state.json already gone, optimizer.pt and RNG still there
    shutil.copytree(path, pruned)
    (pruned / "COMPLETE").unlink()
    (pruned / "trainer_state.json").unlink()
    further = tmp_path / "more-pruned"  # of the training state only optimizer.pt is left
    shutil.copytree(pruned, further)
    (further / "rng_state_0.pth").unlink()
    for directory in (temporary, pruned, further):
        with pytest.raises(ValueError, match="incomplete checkpoint"):
            _model(directory)
    assert _model(path).model_dir == path  # the complete one loads


def test_the_library_refuses_what_the_job_spec_refuses() -> None:
    # One rule (twinkle_core.options) for JobSpec and TransformersModel's strategies.
    mesh = MeshClass(dp_size=1, fsdp_size=2)
    with pytest.raises(
        ValueError, match="mixed_precision 'fp8' is not supported by the 'native_fsdp' strategy"
    ):
        make_strategy("native_fsdp", mesh, _info(), "fp8", None, None, False)
