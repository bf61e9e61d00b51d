"""``model.trainable_layers``: only the top N decoder layers (and the final norm) train, nothing below them
is recomputed, and the KL reference keeps the top layers' starting weights without a second model."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from helpers import compose, plain_grpo
from score_lightning.step.batching import build_token_batch, policy_logprobs
from score_lightning.launch.config_validation import ConfigError, validate_config
from score_lightning.policy.top_layers import TopLayersReference, train_top_layers


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _batch():
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 200, (9,), generator=g).tolist()] * 2
    resp = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (6, 4)]
    return build_token_batch(prompts, resp, [[1] * len(r) for r in resp], pad_id=0)


def test_only_the_top_layers_and_norm_train_and_nothing_below_is_recomputed():
    model = _model()
    names = train_top_layers(model, 1)
    assert names == ["model.layers.3" + s for s in (".self_attn.q_proj.weight", ".self_attn.k_proj.weight",
                     ".self_attn.v_proj.weight", ".self_attn.o_proj.weight", ".mlp.gate_proj.weight",
                     ".mlp.up_proj.weight", ".mlp.down_proj.weight", ".input_layernorm.weight",
                     ".post_attention_layernorm.weight")] + ["model.norm.weight"]
    calls = [0] * 4  # runs of each layer's checkpointed function: its forward, and its recomputation in backward
    for i, layer in enumerate(model.model.layers):
        def counted(fn, *a, _f=layer._gradient_checkpointing_func, i=i, **k):
            def run(*aa, **kk):
                calls[i] += 1
                return fn(*aa, **kk)
            return _f(run, *a, **k)
        layer._gradient_checkpointing_func = counted
    batch = _batch()
    logp, _ = policy_logprobs(model, batch)
    (-(logp * batch.loss_mask).sum()).backward()
    assert calls == [1, 1, 1, 2]  # the top layer runs again in backward (checkpointing), the frozen ones do not
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all((grads[n] is not None) == (n in names) for n in grads)
    assert all(grads[n].abs().sum() > 0 for n in names)


def test_reference_keeps_the_starting_top_layers():
    model = _model()
    train_top_layers(model, 2)
    ref = TopLayersReference(model)
    assert list(ref.parameters()) == []  # no second model in the registry (checkpoints, DDP)
    batch = _batch()
    with torch.no_grad():
        start = policy_logprobs(model, batch)[0]
        torch.testing.assert_close(policy_logprobs(ref, batch, share_prompt=True)[0] * batch.loss_mask,
                                   start * batch.loss_mask)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    logp, _ = policy_logprobs(model, batch)
    (-(logp * batch.loss_mask).sum()).backward()
    opt.step()
    with torch.no_grad():
        moved = policy_logprobs(model, batch)[0]
        kept = policy_logprobs(ref, batch)[0]
    assert (moved - start).abs().max() > 1e-3
    torch.testing.assert_close(kept, start)
    assert all(not p.requires_grad for p in model.model.layers[0].parameters())


def test_config_refuses_lora_together_and_bad_counts():
    for extra, text in ((["model.trainable_layers=2", "model.lora.enabled=true"], "choose one"),
                        (["model.trainable_layers=0"], "integer >= 1")):
        with pytest.raises(ConfigError, match=text):
            validate_config(compose(["experiment=tiny_score", *extra]))
    validate_config(compose(["experiment=tiny_score", "model.trainable_layers=1"]))


def _update(reuse: bool, share_prompt: bool):
    """One GRPO update (reference pass, forward with gradient, SGD step) of a top-2 policy; how often each frozen
    layer computed (its MLP ran)."""
    from score_lightning.rollout.trajectory import Trajectory
    from score_lightning.step.solver_update import GRPOSettings, OptimizerHooks, solver_update
    from score_lightning.policy.top_layers import reuse_frozen_bottom

    model = _model()
    train_top_layers(model, 2)
    ref = TopLayersReference(model)
    runs = [0, 0]
    for i in (0, 1):
        model.model.layers[i].mlp.register_forward_hook(lambda *a, i=i: runs.__setitem__(i, runs[i] + 1))
    g = torch.Generator().manual_seed(5)
    trajs = []
    for q in range(2):
        prompt = torch.randint(3, 200, (7,), generator=g).tolist()  # same shapes: only the ids tell them apart
        for n in (5, 3):
            resp = torch.randint(3, 200, (n,), generator=g).tolist()
            trajs.append(Trajectory(prompt, resp, [1] * n))
    settings = GRPOSettings(2, 1.0, 2, 2, 1, 0.2, 0.28, 0.05, 10.0, 0.0, 1e-6, **plain_grpo(share_prompt=share_prompt))
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)

    def step():
        opt.step()
        opt.zero_grad()
        return 0.0, True

    hooks = OptimizerHooks(lambda loss: loss.backward(), step, torch.device("cpu"))
    with reuse_frozen_bottom(model, 2) if reuse else torch.no_grad() as stats:
        torch.set_grad_enabled(True)
        out = solver_update(model, ref, trajs, torch.tensor([0.1, 0.9, 0.4, 0.3]), settings, 0, hooks)
    return out.sums, {n: p.detach().clone() for n, p in model.named_parameters()}, runs, stats


@pytest.mark.parametrize("share_prompt", [False, True])
def test_reusing_the_frozen_bottom_changes_nothing_but_its_runs(share_prompt):
    """With reuse the frozen layers run once per micro-batch (the reference pass) instead of twice, and the
    update's loss terms and new weights are those of the update without it."""
    sums, weights, runs, _ = _update(False, share_prompt)
    sums_r, weights_r, runs_r, stats = _update(True, share_prompt)
    assert runs == [4, 4] and runs_r == [2, 2]  # 2 micro-batches x (reference + gradient) -> reference only
    assert stats == {"hits": 2, "misses": 2}
    assert sums.keys() == sums_r.keys() and all(abs(sums[k] - sums_r[k]) < 1e-6 for k in sums)
    for n in weights:
        torch.testing.assert_close(weights_r[n], weights[n], atol=0, rtol=0)
    assert any((weights[n] - _model().state_dict()[n]).abs().max() > 0 for n in weights)  # the update moved them
    # the block restores the layers: a later forward runs every layer again
    assert "forward" not in _model().model.layers[0].__dict__


def test_generation_inside_the_block_is_not_replayed():
    """A forward with a KV cache (decoding) never records or replays: greedy ids equal those outside the block."""
    from score_lightning.policy.top_layers import reuse_frozen_bottom

    model = _model().eval()
    train_top_layers(model, 1)
    ids = torch.tensor([[5, 6, 7, 8]])
    want = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with reuse_frozen_bottom(model, 1) as stats:
        got = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        again = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want) and torch.equal(again, want)
    assert stats == {"hits": 0, "misses": 0}


def test_two_steps_with_reuse_export_the_weights_of_two_steps_without(tmp_path, tiny_ckpt, corpus_file, monkeypatch):
    """The trainer with ``optim.reuse_frozen_bottom`` (scripted rollouts, non-zero rewards, top layer of the tiny
    model): it replays the frozen layer in both updates of each step and exports the same weights as without."""
    from safetensors.torch import load_file

    from helpers import FAST
    from score_lightning import module as M
    from score_lightning.launch.training import run

    seen: list[dict] = []
    real = M.update_scope

    def spy(model_cfg, optim, model):
        scope = real(model_cfg, optim, model)
        return _Recorded(scope, seen)

    monkeypatch.setattr(M, "update_scope", spy)
    weights = []
    for reuse in (False, True):
        out = tmp_path / f"reuse{reuse}"
        run(compose(FAST + [f"paths.output_dir={out}", "trainer.max_steps=2", "rollout=scripted",
                            "solver.max_response_tokens=200", "evaluator.max_response_tokens=400",
                            "evaluator.max_rubric_tokens=160", "model.trainable_layers=1",
                            f"optim.reuse_frozen_bottom={str(reuse).lower()}"]))
        weights.append(load_file(next((out / "export").glob("*.safetensors"))))
    # per step, one scope per update (solver, then evaluator), each replaying its gradient pass once: the
    # solver's records are freed before the evaluator's update starts
    assert [s["hits"] for s in seen] == [0, 0, 0, 0, 1, 1, 1, 1]
    start = load_file(next(tiny_ckpt.glob("*.safetensors")))
    assert any(not torch.equal(weights[0][n], start[n]) for n in weights[0] if "layers.1." in n)  # it trained
    assert weights[0].keys() == weights[1].keys()
    for n in weights[0]:
        torch.testing.assert_close(weights[1][n], weights[0][n], atol=0, rtol=0)


class _Recorded:
    def __init__(self, scope, seen: list):
        self.scope, self.seen = scope, seen

    def __enter__(self):
        self.stats = self.scope.__enter__()
        return self.stats

    def __exit__(self, *exc):
        self.seen.append(dict(self.stats))
        return self.scope.__exit__(*exc)


def test_a_separate_evaluator_trains_the_same_top_layers(tiny_ckpt):
    """``model.trainable_layers`` with ``actor.shared=false`` (the frozen-solver ablation): the evaluator's own
    model trains its top layers only, like the solver, not every weight."""
    from helpers import FAST
    from score_lightning.module import ScoreModule

    cfg = compose(FAST + ["model.trainable_layers=1", "actor.shared=false", "solver.freeze=true"])
    module = ScoreModule(cfg, str(tiny_ckpt))
    module.configure_model()
    trained = sorted(n for n, p in module.evaluator_policy.named_parameters() if p.requires_grad)
    assert trained and all(".layers.1." in n or n == "model.norm.weight" for n in trained), trained
    assert not any(p.requires_grad for p in module.policy.parameters())  # the frozen solver
