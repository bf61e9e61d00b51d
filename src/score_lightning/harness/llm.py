"""The paper's meta-harness: an external LLM behind an OpenAI-compatible chat-completions API.

Every refresh sends the training statistics, the constraints in force (and, when configured, the
base constraints to relax back to); the LLM replies with a JSON object in the meta-harness schema,
validated by ``HarnessState.from_dict``. As in the paper, the reply may also replace the candidate
dimension pool (``allow_pool_edits``); a pool edit is checked by :func:`validate_pool`.

The trainer must never stall or crash because this backend is slow, down or creative, so *any*
failure (timeout, connection error, HTTP error, unparsable, truncated or schema-violating reply)
keeps the previous state unchanged, counts ``failures``, records ``last_error`` and logs a warning.
Retries: the ``openai`` SDK retries transport failures (connection, timeout, 408/409/429/5xx);
an invalid reply is re-asked with the reason (:class:`~score_lightning.clients.chat.ChatClient`),
both up to ``max_retries`` times. Other 4xx errors (bad key, unknown model) are not retried.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any, Mapping

from score_lightning.harness.base import clean_stats
from score_lightning.clients.chat import ChatClient, extract_json_object
from score_lightning.harness.state import HarnessState, HarnessStateError

__all__ = ["LLMHarness", "extract_json_object", "parse_reply", "system_prompt", "validate_pool"]

log = logging.getLogger(__name__)

#: Dimension names an edited pool may use: they appear in rubric XML and TensorBoard tags.
POOL_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{1,39}$")
MAX_DEFINITION_CHARS = 300

_INTRO = """\
You are the meta-harness of SCORE, a training method in which one language model acts both as a \
solver (writing deep-research reports with a search tool) and as an evaluator (choosing a rubric, \
verifying claims by search, and scoring the reports). You are NOT trained. Every few training steps \
you read training statistics and set the CONSTRAINTS the evaluator must respect in the next steps.

You set constraints only. Never choose the evaluator's concrete dimensions or weights: the \
evaluator picks k dimensions from the pool (the must_include ones always included) and weights \
inside [weight_min, weight_max] summing to 1.

Reply with exactly one JSON object and nothing else, in this schema:
{"dimension_constraints": {"k": int, "must_include": [dimension names from the pool], \
"weight_min": number, "weight_max": number},
 "process_constraints": {"require_gap_analysis": bool, "require_verification": bool, \
"citation_cross_check": bool, "min_number_of_tool_call": int},
 "notes": "one or two sentences to the evaluator explaining what to focus on and why"%s}
Rules: 1 <= k <= pool size; len(must_include) <= k; 0 <= weight_min <= weight_max <= 1; \
k*weight_min <= 1 <= k*weight_max; 0 <= min_number_of_tool_call <= 10. Do not include "version".
"""

_POOL_EDITS = """
The candidate dimension pool is yours to edit. To change it, add "dimension_pool": {name: one-line \
definition, ...} with the WHOLE new pool: it replaces the current pool, so repeat every dimension \
you keep, with its definition. Omit "dimension_pool" to keep the pool as it is (the usual case). \
Names are lowercase snake_case (a letter, then 1-39 letters, digits or _); definitions are one \
non-empty line; the pool has 2 to %d dimensions and must contain every must_include name; k must \
not exceed its size. Add a dimension when the statistics show a failure the current dimensions \
cannot score (e.g. reports gaming something no dimension checks); remove one that rubrics never \
pick (dims/<name>_freq near 0 for several refreshes) or that duplicates another. Change at most \
one or two dimensions per refresh.
"""

_NO_POOL_EDITS = '\nDo not include "dimension_pool": the pool is fixed in this run.\n'

_REACTIONS = """
How to react to the statistics (all in [0, 1] unless noted; a missing statistic means no evidence):
- verified_rate low (evaluator rarely verifies claims by search): require_verification = true and \
raise min_number_of_tool_call by 1; consider citation_cross_check = true.
- verification_depth_mean (searches per scoring, a count) below min_number_of_tool_call: the \
evaluator is not doing the searches already required; require_verification = true and state it in \
notes, but do not raise min_number_of_tool_call further until it complies.
- consistency high (> 0.8) or reward_std very low (< 0.05): the rubric is saturated and no longer \
separates reports; raise k by 1 and require_gap_analysis = true.
- rubric_valid_rate low: the evaluator cannot satisfy the weight bounds; widen them (lower \
weight_min, raise weight_max).
- answer_valid_rate low or tool_calls_mean far below min_number_of_tool_call: the solver struggles; \
do not tighten further this round.
- entropy falling fast with rising reward_mean: the solver may be exploiting the evaluator; prefer \
verification and citation cross-checks.
- when everything is healthy, move gently back toward base_constraints (the configured starting \
point; if absent, keep the current constraints); change little at a time.
"""


def system_prompt(allow_pool_edits: bool = True, max_pool_size: int = 24) -> str:
    """The meta-harness instructions; the pool paragraph depends on whether edits are allowed."""
    pool_key = ',\n "dimension_pool": {name: definition} (optional, see below)' if allow_pool_edits else ""
    pool = _POOL_EDITS % max_pool_size if allow_pool_edits else _NO_POOL_EDITS
    return _INTRO % pool_key + pool + _REACTIONS



class LLMHarness:
    """OpenAI-compatible meta-harness client (official ``openai`` SDK, ``chat.completions.create``)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout_s: float = 30.0,
        max_retries: int = 1,
        temperature: float = 0.0,
        max_tokens: int | None = 1024,
        extra_body: Mapping[str, Any] | None = None,
        allow_pool_edits: bool = True,
        max_pool_size: int = 24,
        base_state: HarnessState | Mapping[str, Any] | None = None,
    ) -> None:
        """``api_key_env`` names the variable holding the key (unset: a placeholder key, which local
        servers ignore). ``base_state`` (e.g. ``${harness.initial_state}``) is shown to the LLM as the
        state to relax back to. ``max_pool_size`` bounds an edited pool."""
        if max_pool_size < 2:
            raise ValueError(f"harness: max_pool_size={max_pool_size} must be >= 2")
        self.api_key_env = api_key_env
        key = os.environ.get(api_key_env) if api_key_env else None
        self.chat = ChatClient(base_url, model, key, timeout_s=timeout_s, max_retries=max_retries,
                               temperature=temperature, max_tokens=max_tokens, extra_body=extra_body)
        self.model = model
        self.max_retries = max_retries
        self.allow_pool_edits = bool(allow_pool_edits)
        self.max_pool_size = int(max_pool_size)
        self.base_state = None if base_state is None else HarnessState.coerce(base_state)
        self.failures = 0
        self.last_error = ""

    # ------------------------------------------------------------------ public API
    def update(self, state: HarnessState, stats: Mapping[str, float]) -> HarnessState:
        """One refresh: a new state with version + 1, or ``state`` itself when every attempt failed."""
        out = self.chat.ask(self.build_messages(state, stats), lambda content: parse_reply(
            content, state, allow_pool_edits=self.allow_pool_edits, max_pool_size=self.max_pool_size))
        if out.ok:
            return out.value
        transport = out.error in ("timeout", "queue_timeout", "connection") or str(out.error).startswith("http_")
        self.failures += 1
        self.last_error = out.detail if transport else f"invalid reply: {out.detail}"
        log.warning("meta-harness refresh failed (%s); keeping constraints version %d", self.last_error, state.version)
        return state

    def build_messages(self, state: HarnessState, stats: Mapping[str, float]) -> list[dict[str, str]]:
        """System prompt plus one user message with the statistics and the constraints in force.

        The pool goes with its definitions only when the LLM may edit it (it must resend it whole);
        otherwise names suffice, since the harness never picks dimensions.
        """
        payload: dict[str, Any] = {
            "statistics": {k: round(v, 4) for k, v in sorted(clean_stats(stats).items())},
            "current_constraints": _constraints(state),
        }
        if self.base_state is not None:
            payload["base_constraints"] = _constraints(self.base_state)
        payload["dimension_pool"] = dict(state.dimension_pool) if self.allow_pool_edits else list(state.dimension_pool)
        payload["refresh"] = state.version + 1
        user = (
            "Training statistics over the last window and the constraints currently in force:\n"
            + json.dumps(payload, indent=2)
            + "\nReply with the new constraints as one JSON object."
        )
        return [{"role": "system", "content": system_prompt(self.allow_pool_edits, self.max_pool_size)},
                {"role": "user", "content": user}]

    def close(self) -> None:
        self.chat.close()


def _constraints(state: HarnessState) -> dict[str, Any]:
    d = state.to_dict(include_pool=False)
    d.pop("version", None)
    return d


def validate_pool(pool: Any, max_pool_size: int = 24) -> dict[str, str]:
    """A pool edit from an LLM reply, checked; definitions stripped. Raises ``HarnessStateError``."""
    if not isinstance(pool, dict):
        raise HarnessStateError("dimension_pool: must be an object {name: one-line definition}")
    if not 2 <= len(pool) <= max_pool_size:
        raise HarnessStateError(f"dimension_pool: has {len(pool)} dimensions; allowed 2 to {max_pool_size}")
    out: dict[str, str] = {}
    for name, definition in pool.items():
        if not POOL_NAME_RE.match(name):
            raise HarnessStateError(f"dimension_pool: name {name!r} must match {POOL_NAME_RE.pattern}")
        text = definition.strip() if isinstance(definition, str) else ""
        if not text or "\n" in text or len(text) > MAX_DEFINITION_CHARS:
            raise HarnessStateError(
                f"dimension_pool.{name}: definition must be one non-empty line of at most {MAX_DEFINITION_CHARS} chars")
        out[name] = text
    return out


def parse_reply(content: str, state: HarnessState, *, allow_pool_edits: bool = True,
                max_pool_size: int = 24) -> HarnessState:
    """Validate an LLM reply against the schema; keys it omits (the pool too) stay from ``state``."""
    data = extract_json_object(content)
    data.pop("version", None)  # the harness, not the LLM, counts refreshes
    if not {"dimension_constraints", "process_constraints", "dimension_pool"} & set(data):
        raise HarnessStateError("reply has none of dimension_constraints, process_constraints, dimension_pool")
    if "dimension_pool" in data:
        if not allow_pool_edits:
            raise HarnessStateError("dimension_pool: pool edits are disabled in this run; omit dimension_pool")
        data["dimension_pool"] = validate_pool(data["dimension_pool"], max_pool_size)
    new = HarnessState.from_dict(data, base=state)  # must_include within the pool, k <= pool size
    new.version = state.version + 1
    return new
