"""Trainer-side log-probs on the real tiny model: masks, gradient reach, REINFORCE direction."""

from __future__ import annotations

import torch

from score_lightning.step.batching import build_token_batch, policy_logprobs
from score_lightning.step.losses import grpo_token_loss, reinforce_loss
from score_lightning.policy.models import load_policy


def test_loss_mask_marks_exactly_model_response_tokens():
    b = build_token_batch([[1, 2, 3]], [[4, 5, 6, 7]], [[1, 0, 0, 1]], pad_id=0)
    # targets are ids[1:] = 2 3 4 5 6 7; prompt targets (2, 3) are 0, then the response mask
    assert b.loss_mask.tolist() == [[0, 0, 1, 0, 0, 1]]
    rows = build_token_batch([[1], [1, 2, 3]], [[4], [4, 5]], [[1], [1, 1]], pad_id=0)
    sub = rows.rows([0])
    assert sub.input_ids.tolist() == [[1, 4]] and sub.loss_mask.tolist() == [[1.0]]  # trimmed, no global padding


def test_gradients_reach_only_model_tokens(tiny_ckpt):
    torch.manual_seed(0)
    model = load_policy(tiny_ckpt)
    prompt, resp = list(range(10, 20)), list(range(30, 42))
    mask = [1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1, 1]  # positions 3-6 and 9 are observation tokens
    batch = build_token_batch([prompt], [resp], [mask], pad_id=0)
    captured = {}

    def keep_logits(module, args, output):
        output.logits.retain_grad()
        captured["logits"] = output.logits

    handle = model.register_forward_hook(keep_logits)
    logp, _ = policy_logprobs(model, batch)
    handle.remove()
    adv = torch.tensor([1.0])
    loss_sum, stats = grpo_token_loss(logp, logp.detach(), None, adv, batch.loss_mask, clip_low=0.2, clip_high=0.2,
                                      kl_coef=0.0)
    (loss_sum / stats["tokens"]).backward()
    grad = captured["logits"].grad[0]
    full = batch.loss_mask[0].bool()
    if grad.shape[0] == full.shape[0] + 1:
        grad = grad[:-1]  # all positions projected: position t scores target t+1
    offset = full.shape[0] - grad.shape[0]  # the LM head may skip leading prompt positions (never in the loss)
    assert not full[:offset].any()
    per_pos, m = grad.abs().sum(dim=-1), full[offset:]
    assert torch.all(per_pos[~m] == 0), "a masked (prompt/observation) position received gradient"
    assert torch.all(per_pos[m] > 0)


def test_positive_evaluator_advantage_raises_rubric_logprob(tiny_ckpt, tokenizer):
    rubric_ids = tokenizer('<dimensions><dim name="insight" weight="1.0"/></dimensions>', add_special_tokens=False)[
        "input_ids"]
    prompt = tokenizer("Pick a rubric.", add_special_tokens=False)["input_ids"]
    batch = build_token_batch([prompt], [rubric_ids], [[1] * len(rubric_ids)], pad_id=tokenizer.pad_token_id)

    def seq_lp(model):
        lp, _ = policy_logprobs(model, batch)
        return (lp * batch.loss_mask).sum(dim=1)

    for advantage, direction in ((+1.0, 1), (-1.0, -1)):
        torch.manual_seed(0)
        model = load_policy(tiny_ckpt)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        before = float(seq_lp(model))
        reinforce_loss(seq_lp(model), advantage).backward()
        opt.step()
        after = float(seq_lp(model))
        assert (after - before) * direction > 1e-3, (advantage, before, after)
