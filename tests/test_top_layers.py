"""``model.trainable_layers``: only the top N decoder layers (and the final norm) train, nothing below them
is recomputed, and the KL reference keeps the top layers' starting weights without a second model."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from helpers import compose
from score_lightning.batching import build_token_batch, policy_logprobs
from score_lightning.config_validation import ConfigError, validate_config
from score_lightning.top_layers import TopLayersReference, train_top_layers


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
