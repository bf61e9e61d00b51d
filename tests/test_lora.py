"""LoRA (``model.lora``) on the tiny model: only adapters train, the reference is the base, exports merge.

Two real SCORE steps with the scripted engine (non-zero, varied rewards, so the adapters get a
gradient) and the KL term on; then the weights, the reference, the optimiser and both exports are
checked against the untouched base checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from safetensors.torch import load_file

from helpers import FAST, compose, read_scalars
from score_lightning.step.batching import build_token_batch, policy_logprobs

LORA = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8"]
#: the scripted engine (rewards vary within each group), two queries per step, KL to the reference on
COMMON = FAST + LORA + [
    "rollout=scripted", "solver.num_rollouts=3", "solver.max_response_tokens=200", "evaluator.max_response_tokens=400",
    "evaluator.max_rubric_tokens=160", "data.batch_size=2", "optim.mini_batch_size=2", "optim.micro_batch_size=3",
    "optim.lr=1e-3", "optim.warmup_steps=0", "loss.kl_coef=0.05", "trainer.max_steps=2", "harness.every_n_steps=10",
]


class Snapshot(L.Callback):
    """The policy's weights and the trainer's optimiser parameters when training starts."""

    def on_train_start(self, trainer, module):
        self.start = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}
        self.optimised = [p for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_ckpt, corpus_file):
    from score_lightning.launch.training import run

    out = tmp_path_factory.mktemp("lora")
    snap, box = Snapshot(), {}
    run(compose(COMMON + [f"paths.output_dir={out}"]), extra_callbacks=[snap],
        module_hook=lambda m: box.setdefault("m", m))
    return out, box["m"], snap


def _base_name(name: str) -> str:
    return name.replace(".base_layer.", ".")


def _solver_batch(module):
    trajs = module.last_step["rollouts"].solver
    return build_token_batch([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                             [t.response_mask for t in trajs], module.tokenizer.pad_token_id)


def test_only_adapters_train_and_the_base_stays_bitwise(lora_run, tiny_ckpt):
    out, module, snap = lora_run
    base = load_file(next(Path(tiny_ckpt).glob("*.safetensors")))
    end = {k: v.detach() for k, v in module.policy.state_dict().items()}
    adapters = {k for k in end if ".lora_" in k}
    assert adapters and {_base_name(k) for k in end if k not in adapters} == set(base)
    assert all(torch.equal(end[k], base[_base_name(k)]) for k in end if k not in adapters), "a base weight moved"
    moved = max(float((end[k] - snap.start[k]).abs().max()) for k in adapters)
    assert moved > 1e-4, f"the adapters did not learn (max change {moved:.2e}): the check would be vacuous"
    # the optimiser holds exactly the adapters; every base weight is frozen
    trainable = {id(p) for n, p in module.policy.named_parameters() if p.requires_grad}
    assert {id(p) for p in snap.optimised} == trainable
    assert trainable == {id(p) for n, p in module.policy.named_parameters() if ".lora_" in n}
    assert min(v for _, v in read_scalars(out / "tensorboard")["solver/reward_std"]) > 0, "rewards must vary"


def test_reference_is_the_base_model_without_a_second_copy(lora_run, tiny_ckpt):
    from score_lightning.policy.lora import ReferenceModel, adapters_disabled
    from score_lightning.policy.models import load_policy

    out, module, _ = lora_run
    # memory: the reference is a view of the policy, owning no parameters of its own
    assert isinstance(module.ref, ReferenceModel) and module.ref.policy is module.policy
    assert list(module.ref.parameters()) == []
    assert {id(p) for p in module.parameters()} == {id(p) for p in module.policy.parameters()}
    assert not [k for k in module.state_dict() if k.startswith("ref.")]
    batch = _solver_batch(module)
    temp = float(module.cfg.solver.temperature)
    with torch.no_grad():
        ref_lp, _ = policy_logprobs(module.ref, batch, temp)
        base_lp, _ = policy_logprobs(load_policy(tiny_ckpt, "float32"), batch, temp)
        with adapters_disabled(module.policy):
            off_lp, _ = policy_logprobs(module.policy, batch, temp)
        lora_lp, _ = policy_logprobs(module.policy, batch, temp)
    mask = batch.loss_mask.bool()
    assert torch.allclose(ref_lp[mask], base_lp[mask], atol=1e-6) and torch.equal(ref_lp, off_lp)
    assert float((lora_lp - ref_lp)[mask].abs().max()) > 1e-4, "after training the policy must differ from the base"
    assert all(p.requires_grad for n, p in module.policy.named_parameters() if ".lora_" in n)  # flags restored
    # in the loss: KL = 0 at the first step (B = 0: policy == base), > 0 once the adapters moved
    kl = [v for _, v in read_scalars(out / "tensorboard")["solver/kl"]]
    assert kl[0] == pytest.approx(0.0, abs=1e-7) and kl[1] > 0


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_merged_export_reloads_without_peft_and_the_adapter_with_it(lora_run, tiny_ckpt):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from score_lightning.policy.lora import lora_layers
    from score_lightning.policy.models import load_policy

    out, module, _ = lora_run
    export = out / "export"
    assert not (export / "adapter_config.json").exists()  # else HF/vLLM would treat the dir as an adapter
    merged = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    assert not lora_layers(merged)
    assert set(load_file(export / "model.safetensors")) == set(load_file(next(Path(tiny_ckpt).glob("*.safetensors"))))
    ids = torch.tensor([t.prompt_ids + t.response_ids for t in module.last_step["rollouts"].solver[:1]])
    want = _logits(module.policy, ids)
    assert (want - _logits(load_policy(tiny_ckpt, "float32"), ids)).abs().max() > 1e-4  # the export is not the base
    assert torch.allclose(_logits(merged, ids), want, atol=1e-5)
    adapter = PeftModel.from_pretrained(load_policy(tiny_ckpt, "float32"), export / "adapter")
    assert torch.allclose(_logits(adapter, ids), want, atol=1e-6)


def test_export_script_rebuilds_the_lora_policy_from_its_checkpoint(lora_run, tmp_path):
    from score_lightning.policy.export import export_checkpoint

    out, _, _ = lora_run
    again = export_checkpoint(out / "checkpoints" / "last.ckpt", tmp_path / "again")
    run_export, from_ckpt = load_file(out / "export" / "model.safetensors"), load_file(again / "model.safetensors")
    assert run_export.keys() == from_ckpt.keys() and all(torch.equal(run_export[k], from_ckpt[k]) for k in run_export)
    assert (again / "adapter" / "adapter_model.safetensors").exists()


def test_merge_streams_base_names_and_refuses_unknown_lora_tensors():
    from score_lightning.policy.lora import merge_lora

    w, a, b = torch.randn(3, 4), torch.randn(2, 4), torch.randn(3, 2)
    named = [("l.q.base_layer.weight", w), ("l.q.base_layer.bias", torch.ones(3)), ("l.q.lora_A.default.weight", a),
             ("l.q.lora_B.default.weight", b), ("norm.weight", torch.ones(4))]
    out = dict(merge_lora(iter(named), {"l.q": 0.5}))
    assert list(out) == ["l.q.bias", "l.q.weight", "norm.weight"]
    assert torch.allclose(out["l.q.weight"], w + 0.5 * b @ a)
    with pytest.raises(ValueError, match="lora_embedding_A"):
        list(merge_lora(iter([("e.lora_embedding_A.default", a)]), {}))
    with pytest.raises(ValueError, match="incomplete"):
        list(merge_lora(iter(named[:1]), {"l.q": 0.5}))


def test_adapters_train_under_gradient_checkpointing_and_keep_their_flags(tiny_ckpt):
    """The 7B preset checkpoints activations; a frozen adapter stays frozen after a reference forward."""
    from score_lightning.policy.lora import ReferenceModel
    from score_lightning.policy.models import load_policy

    policy = load_policy(tiny_ckpt, "float32", gradient_checkpointing=True,
                         lora={"enabled": True, "r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"],
                               "dropout": 0.0})
    policy.train()
    ids = torch.randint(0, 1000, (2, 16))
    policy(input_ids=ids, labels=ids).loss.backward()
    grads = {n: p.grad for n, p in policy.named_parameters() if p.requires_grad}
    assert grads and all(".lora_" in n and g is not None for n, g in grads.items())
    assert len(grads) == 2 * 2 * policy.config.num_hidden_layers  # A and B of q_proj and v_proj per layer
    policy.requires_grad_(False)  # solver.freeze
    ReferenceModel(policy)(input_ids=ids)
    assert not any(p.requires_grad for p in policy.parameters())


def test_lora_config_is_validated_and_a_separate_evaluator_refused_by_name():
    from score_lightning.launch.config_validation import ConfigError, validate_config

    validate_config(compose(FAST + LORA))
    cfg = compose(FAST + ["model.lora.enabled=true", "model.lora.r=0", "model.lora.target_modules=[]",
                          "actor.shared=false"])
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    text = str(err.value)
    assert "model.lora.r=0" in text and "model.lora.target_modules" in text
    assert "model.lora.enabled=true with actor.shared=false" in text
    validate_config(compose(FAST + ["model.lora.enabled=false"]))  # LoRA off


@pytest.mark.multiprocess  # two or more training processes: make test-multiprocess (CI runs it)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_train_the_same_adapters_as_one(lora_run, tmp_path, strategy):
    """DDP and FSDP2 on 2 CPU processes (gloo): the merged export equals the 1-process run's.

    Frozen base weights are outside DDP's reducer and inside FSDP2's shards without gradients; the
    reference forward runs on the sharded policy with adapters off (collective, like the policy's).
    """
    import os
    import subprocess
    import sys

    from helpers import ROOT

    out1, _, _ = lora_run
    out = tmp_path / strategy
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cmd = [sys.executable, "src/train.py", *COMMON, f"strategy={strategy}", "trainer.devices=2",
           f"paths.output_dir={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    w1, w2 = load_file(out1 / "export" / "model.safetensors"), load_file(out / "export" / "model.safetensors")
    assert w1.keys() == w2.keys()
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert worst < 1e-5, f"LoRA under {strategy} on 2 processes differs from 1 process by {worst:.2e}"
    assert (out / "export" / "adapter" / "adapter_model.safetensors").exists()
