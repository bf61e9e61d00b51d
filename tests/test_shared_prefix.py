"""Packing a prompt with its continuations (one forward per prompt group) gives each row's own log-probs,
entropies and gradients, under gradient checkpointing, for grouped-query attention and the eager path."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from score_lightning.policy.attention import use_grouped_attention
from score_lightning.step.batching import build_token_batch, policy_logprobs
from score_lightning.policy.shared_prefix import pack_group, prompt_groups


def _model(attn: str, checkpointing: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      attn_implementation="sdpa" if attn == "score_sdpa" else attn)
    model = LlamaForCausalLM(cfg)
    if attn == "score_sdpa":
        assert use_grouped_attention(model)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _batch():
    g = torch.Generator().manual_seed(1)
    p1 = torch.randint(3, 300, (23,), generator=g).tolist()
    p2 = torch.randint(3, 300, (17,), generator=g).tolist()
    lens = [9, 14, 5, 11, 7]  # rows 0-2 share p1, rows 3-4 share p2 (interleaved below)
    resp = [torch.randint(3, 300, (n,), generator=g).tolist() for n in lens]
    masks = [[1] * n for n in lens]
    masks[1][4:8] = [0] * 4  # an observation inside a trajectory: in the context, not trained
    order = [0, 3, 1, 4, 2]
    prompts = [p1, p1, p1, p2, p2]
    return build_token_batch([prompts[i] for i in order], [resp[i] for i in order], [masks[i] for i in order],
                             pad_id=0)


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("attn,checkpointing", [("score_sdpa", True), ("sdpa", False), ("eager", True)])
def test_packed_rows_match_padded_rows(attn, checkpointing):
    batch = _batch()
    out = {}
    for share in (False, True):
        model = _model(attn, checkpointing)
        logp, ent = policy_logprobs(model, batch, temperature=0.7, with_entropy=True, share_prompt=share)
        loss = -(logp * batch.loss_mask * torch.linspace(0.5, 1.5, logp.shape[0])[:, None]).sum()
        loss.backward()
        out[share] = (logp.detach() * batch.loss_mask, ent * batch.loss_mask, _grads(model))
    for a, b in zip(out[False], out[True]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert out[True][0].abs().sum() > 0 and out[True][2].abs().sum() > 0


def test_packed_path_runs_one_forward_per_prompt():
    """Two prompt groups: two model calls over 23 + 28 and 17 + 18 tokens, not five padded rows."""
    batch = _batch()
    model = _model("score_sdpa", True)
    seen = []
    model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    policy_logprobs(model, batch, share_prompt=True)
    assert seen == [(1, 23 + 9 + 14 + 5), (1, 17 + 11 + 7)]


def test_flash_attention_models_take_the_padded_path():
    batch = _batch()
    model = _model("sdpa", False)
    model.config._attn_implementation = "flash_attention_2"  # no custom 4D mask: must not pack
    from score_lightning.step.batching import _shared_prompt_logprobs

    assert _shared_prompt_logprobs(model, batch, 1.0, False, False, True, None) is None


def test_pack_group_layout_by_hand():
    pack = pack_group([5, 6, 7], [[8, 9], [10]])
    assert pack.input_ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert pack.position_ids.tolist() == [[0, 1, 2, 3, 4, 3]]
    # token 8 and token 10 are predicted at the prompt's last position (2); token 9 at token 8's (3)
    assert pack.keep.tolist() == [2, 3, 2] and pack.labels.tolist() == [8, 9, 10]
    allowed = pack.allowed.int().tolist()
    assert allowed[5] == [1, 1, 1, 0, 0, 1]  # the second continuation sees the prompt and itself, not the first
    assert allowed[4] == [1, 1, 1, 1, 1, 0]
    assert allowed[1] == [1, 1, 0, 0, 0, 0]
    assert prompt_groups([[1], [2], [1]]) == [[0, 2], [1]]


def test_solver_update_with_packed_prompts_makes_the_same_update():
    """The whole GRPO update (reference KL, clipped surrogate, one optimiser step) with and without
    ``optim.share_prompt_forward``: the same loss sums and the same new weights."""
    from helpers import compose
    from score_lightning.rollout.trajectory import Trajectory
    from score_lightning.step.rollout_correction import rollout_correction
    from score_lightning.step.solver_update import GRPOSettings, OptimizerHooks, grpo_settings, solver_update

    cfg = compose(["experiment=tiny_score", "optim.share_prompt_forward=true", "solver.num_rollouts=3",
                   "optim.mini_batch_size=2", "optim.micro_batch_size=3", "loss.kl_coef=0.05"])
    settings = grpo_settings(cfg.solver, cfg.optim, cfg.loss, cfg.reward,
                             rollout_correction(cfg.optim, cfg.loss, cfg.rollout))
    assert settings.share_prompt
    batch = _batch()
    order = [0, 2, 4, 1, 3]  # query-major: p1's three rows, then p2's two, plus one more p2 row below
    trajs = []
    for i in order:
        P = int(batch.prompt_lens[i])
        ids = batch.input_ids[i, : int(batch.lengths[i])].tolist()
        mask = [int(x) for x in batch.loss_mask[i, P - 1: int(batch.lengths[i]) - 1].tolist()]
        trajs.append(Trajectory(ids[:P], ids[P:], mask))
    trajs.append(Trajectory(trajs[3].prompt_ids, trajs[3].response_ids[:4], trajs[3].response_mask[:4]))
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.9, 0.4])
    out = {}
    for share in (False, True):
        policy, ref = _model("score_sdpa", True), _model("score_sdpa", False).eval()
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.01 * torch.randn_like(p))
        opt = torch.optim.SGD(policy.parameters(), lr=0.1)

        def step(opt=opt):
            opt.step()
            opt.zero_grad()
            return 0.0, True

        hooks = OptimizerHooks(lambda loss: loss.backward(), step, torch.device("cpu"))
        shapes = []
        for m in (policy, ref):
            m.model.embed_tokens.register_forward_hook(lambda mod, i, o: shapes.append(tuple(i[0].shape)))
        s = GRPOSettings(**{**settings.__dict__, "share_prompt": share})
        res = solver_update(policy, ref, trajs, rewards, s, 0, hooks)
        # packed: the reference and the update each run one row per group, 23 + 9 + 14 + 5 and 17 + 11 + 7 + 4 tokens
        assert (set(shapes) == {(1, 51), (1, 39)}) == share
        out[share] = (res.sums, torch.cat([p.detach().flatten() for p in policy.parameters()]))
    for key in ("pg", "kl", "loss", "tokens"):
        assert out[True][0][key] == pytest.approx(out[False][0][key], rel=1e-4, abs=1e-6), key
    assert out[True][0]["kl"] > 0
    torch.testing.assert_close(out[True][1], out[False][1], rtol=1e-4, atol=1e-6)


def test_lora_policy_and_its_reference_view_pack_the_same():
    """A LoRA policy and its parameter-less reference view (adapters off) take the packed path too."""
    from score_lightning.policy.lora import ReferenceModel, apply_lora

    batch = _batch()
    policy = apply_lora(_model("score_sdpa", True), {"enabled": True, "r": 4, "alpha": 8,
                                                      "target_modules": "all-linear", "dropout": 0.0})
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)  # adapters that change the output, so the reference differs from the policy
    ref = ReferenceModel(policy)
    for model in (policy, ref):
        with torch.no_grad():
            padded, _ = policy_logprobs(model, batch, share_prompt=False)
            packed, _ = policy_logprobs(model, batch, share_prompt=True)
        torch.testing.assert_close(packed * batch.loss_mask, padded * batch.loss_mask, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(policy_logprobs(policy, batch)[0], policy_logprobs(ref, batch)[0])
