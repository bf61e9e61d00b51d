"""Loading policies and references, and the tiny Qwen2-architecture model for CPU runs.

The tiny checkpoint (model + tokenizer) is built locally from a config and the embedded corpus,
saved with ``save_pretrained`` so HF and vLLM load it like any checkpoint, and cached under a key
that hashes every input: change a size, the seed or the corpus and it is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from score_lightning import protocol as P
from score_lightning.errors import ConfigError
from score_lightning.files import file_sha256

log = logging.getLogger(__name__)

#: Qwen2-style chat template: ``<|im_start|>role\ncontent<|im_end|>\n``; generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_BUILD_FORMAT_VERSION = 1  # bump when the build procedure changes so caches are invalidated


@dataclass(frozen=True)
class TinyModelSpec:
    """Sizes of the CPU model. head_dim = hidden_size / num_attention_heads must be >= 32 (vLLM CPU)."""

    vocab_size: int = 4096
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    max_position_embeddings: int = 4096
    seed: int = 0

    def validate(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.tiny.hidden_size={self.hidden_size} must be divisible by num_attention_heads={self.num_attention_heads}"
            )
        head_dim = self.hidden_size // self.num_attention_heads
        if head_dim < 32:
            raise ValueError(f"model.tiny: head_dim={head_dim} < 32 is rejected by vLLM's CPU attention; raise hidden_size")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("model.tiny.num_key_value_heads must divide num_attention_heads")
        if self.vocab_size < 512:
            raise ValueError(f"model.tiny.vocab_size={self.vocab_size} must be >= 512")


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on ``texts``; protocol tags are single added tokens (kept by ``decode``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(P.SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=P.IM_END,
        pad_token=P.ENDOFTEXT,
        unk_token=None,
        additional_special_tokens=[P.IM_START],
    )
    fast.add_tokens(list(P.PROTOCOL_TOKENS), special_tokens=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """A seeded, deterministic Qwen2 causal LM sized for the tokenizer (untied embeddings, see NOTES)."""
    spec.validate()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(P.IM_END),
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def _tokenizer_texts(corpus_path: Path, extra_texts: Iterable[str]) -> list[str]:
    texts = []
    with open(corpus_path, encoding="utf-8") as fh:
        for line in fh:
            texts.append(json.loads(line)["contents"])
    texts.extend(extra_texts)
    return texts


def ensure_tiny_checkpoint(
    cache_dir: str | os.PathLike,
    spec: TinyModelSpec,
    corpus_path: str | os.PathLike,
    extra_texts: Iterable[str] = (),
) -> Path:
    """Build (or reuse) the tiny checkpoint; the directory name hashes all inputs.

    Written to a temporary directory and renamed into place, so concurrent or interrupted builds
    never leave a half-written checkpoint that a later run would trust.
    """
    corpus_path = Path(corpus_path)
    extra = list(extra_texts)
    key_src = json.dumps(
        {"spec": asdict(spec), "corpus": file_sha256(corpus_path), "extra": extra, "v": _BUILD_FORMAT_VERSION,
         "tags": P.PROTOCOL_TOKENS},
        sort_keys=True,
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    out = Path(cache_dir) / f"tiny-qwen2-{key}"
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    log.info("building tiny checkpoint at %s", out)

    def build(tmp: Path) -> None:
        tokenizer = train_tokenizer(_tokenizer_texts(corpus_path, extra), spec.vocab_size)
        build_tiny_model(spec, tokenizer).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return build_atomically(out, build, key_src)


def build_atomically(out: Path, build: Callable[[Path], None], manifest: str) -> Path:
    """Run ``build(tmp)`` in a temporary sibling of ``out``, write ``manifest`` beside it, rename into place.

    Concurrent or interrupted builds never leave a half-written checkpoint that a later run would
    trust; when two processes race, the loser's identical result is discarded.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
    try:
        build(tmp)
        (tmp / "score_lightning_build.json").write_text(manifest)
        try:
            os.rename(tmp, out)
        except OSError:  # another process won the race: its result is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError as exc:
        raise ValueError(f"model.dtype={name!r}: allowed {sorted(_DTYPES)}") from exc


#: Decoded and compared in :func:`load_tokenizer`: every protocol tag, a newline, a space before
#: punctuation (which ``clean_up_tokenization_spaces`` would eat) and non-ASCII text.
ROUND_TRIP_PROBE = (
    "def f(x): return <search>json</search>\n<think>a , b .</think>"
    + "".join(P.PROTOCOL_TOKENS) + " naïve café [json.dumps]"
)
_TURN_PROBE = "SCORE_TURN_END_PROBE"


def load_tokenizer(path: str | os.PathLike, chat_template: str | None = None):
    """Load a checkpoint's tokenizer with the conventions every prompt, stop and parser relies on.

    * **Chat template**: the checkpoint's own. One without a template (a base model) is refused
      by name unless ``chat_template`` (``model.chat_template``: a Jinja string or a ``.jinja``
      file) supplies one; guessing a format would train on prompts the model never saw.
    * **End of turn**: ``eos_token`` becomes the token the chat template closes an assistant turn
      with (Qwen ``<|im_end|>``, Llama-3 ``<|eot_id|>``), which older Llama-3 tokenizer configs
      get wrong (``<|end_of_text|>``). Every id that ends a turn (that one, the configured EOS and
      ``generation_config.json``'s ``eos_token_id`` list) is kept for :func:`end_of_turn_ids`.
    * **Pad**: a tokenizer without one (Llama-3) pads with the EOS. That is safe here because
      every batch carries explicit lengths and attention masks, never ``ids != pad``.
    * **Exact decode**: ``clean_up_tokenization_spaces`` is turned off (it rewrites ``" ."`` to
      ``"."``); stop strings, parsers and the rubric span all read decoded text.
    * A round trip of :data:`ROUND_TRIP_PROBE` must be exact and non-empty (NOTES: some
      transformers versions silently return empty ``input_ids``).
    """
    tok = AutoTokenizer.from_pretrained(str(path))
    _set_chat_template(tok, path, chat_template)
    tok.clean_up_tokenization_spaces = False
    ids = tok(ROUND_TRIP_PROBE, add_special_tokens=False)["input_ids"]
    if not ids or tok.decode(ids) != ROUND_TRIP_PROBE:
        raise RuntimeError(
            f"tokenizer at {path} does not round-trip text (got {len(ids)} ids); "
            "check the transformers version (pinned >=5.16.1,<5.20)"
        )
    configured_eos = tok.eos_token_id
    turn_end = _template_turn_end(tok)
    if turn_end is not None and turn_end != tok.eos_token:
        log.warning("tokenizer at %s: eos_token %r -> %r, the token its chat template ends turns with",
                    path, tok.eos_token, turn_end)
        tok.eos_token = turn_end
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer at {path} has no EOS token and its chat template ends turns with no special token")
    ends = [tok.eos_token_id, configured_eos, *_generation_eos_ids(path)]
    tok.score_end_of_turn_ids = tuple(dict.fromkeys(int(i) for i in ends if i is not None))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def end_of_turn_ids(tokenizer) -> tuple[int, ...]:
    """Ids that end an assistant turn: generation stops on each, the agent reads each as EOS.

    Set by :func:`load_tokenizer`; a tokenizer built elsewhere falls back to its ``eos_token_id``.
    """
    ids = getattr(tokenizer, "score_end_of_turn_ids", None)
    if ids:
        return tuple(ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    return (int(eos),) if eos is not None else ()


def _set_chat_template(tok, path, chat_template: str | None) -> None:
    """Apply ``chat_template`` (a string or a file) or refuse a checkpoint that has none."""
    if chat_template:
        if "{" not in chat_template:  # every Jinja template has "{{" or "{%": this names a file
            file = Path(chat_template).expanduser()
            if not file.is_file():
                raise ConfigError(f"model.chat_template={chat_template!r} is neither a Jinja template nor a file")
            chat_template = file.read_text(encoding="utf-8")
        tok.chat_template = chat_template
    if not getattr(tok, "chat_template", None):
        raise ConfigError(
            f"checkpoint {path} has no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja): "
            "it is probably a base model. Set model.chat_template to the Jinja template (or a .jinja file) "
            "its prompts should use"
        )


def _template_turn_end(tok) -> str | None:
    """The special token the chat template writes right after an assistant message, if any."""
    try:
        text = tok.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": _TURN_PROBE}], tokenize=False)
    except Exception as exc:  # a template that refuses this shape: keep the configured EOS
        log.debug("chat template probe failed: %s", exc)
        return None
    if not isinstance(text, str) or _TURN_PROBE not in text:
        return None
    rest = text[text.rfind(_TURN_PROBE) + len(_TURN_PROBE):]
    specials = {t.content for t in getattr(tok, "added_tokens_decoder", {}).values() if t.special}
    specials.update(getattr(tok, "all_special_tokens", []) or [])
    return next((s for s in sorted(specials, key=len, reverse=True) if s and rest.startswith(s)), None)


def _generation_eos_ids(path) -> list[int]:
    """``eos_token_id`` of the checkpoint's ``generation_config.json`` (an int or a list), if any."""
    from transformers import GenerationConfig

    local = Path(str(path))
    if local.is_dir() and not (local / "generation_config.json").exists():
        return []
    try:
        eos = GenerationConfig.from_pretrained(str(path)).eos_token_id
    except (OSError, ValueError) as exc:
        log.debug("no generation config for %s: %s", path, exc)
        return []
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def load_policy(path: str | os.PathLike, dtype: str = "float32", gradient_checkpointing: bool = False,
                attn_implementation: str | None = None, lora=None, trainable_layers: int | None = None):
    """Load a causal LM from a local directory or hub id (hub ids need network; CPU defaults never do).

    ``lora`` is the ``model.lora`` block: when enabled, LoRA layers are injected and only they train
    (see :mod:`score_lightning.policy.lora`). ``trainable_layers``: only the top N decoder layers and the final
    norm train (:mod:`score_lightning.policy.top_layers`).
    """
    kwargs = {"dtype": resolve_dtype(dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if not attn_implementation:  # grouped-query attention without per-head copies of the KV (attention.py)
        from score_lightning.policy.attention import use_grouped_attention

        use_grouped_attention(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        # HF recomputes a layer only in training mode, from_pretrained returns eval mode, and Lightning (2.6) keeps
        # every submodule's mode: without this, the setting silently did nothing (SmolLM2: 5.1 GB peak RSS in the update)
        model.train()
    from score_lightning.policy.lora import apply_lora, lora_enabled

    if lora_enabled(lora):
        apply_lora(model, lora, str(path))
    if trainable_layers is not None:
        from score_lightning.policy.top_layers import train_top_layers

        train_top_layers(model, int(trainable_layers))
    return model


def load_reference(path: str | os.PathLike, dtype: str, policy, trainable_layers: int | None = None):
    """The frozen KL reference: for a LoRA policy a view of its base (adapters off, no second copy
    in memory); for a top-layers policy its forward with the top layers' starting weights; otherwise
    a second, frozen copy of the starting weights."""
    from score_lightning.policy.lora import ReferenceModel, is_lora

    if is_lora(policy):
        return ReferenceModel(policy)
    if trainable_layers is not None:
        from score_lightning.policy.top_layers import TopLayersReference

        return TopLayersReference(policy)
    return load_policy(path, dtype).eval().requires_grad_(False)
