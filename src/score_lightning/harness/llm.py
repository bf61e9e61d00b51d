"""The paper's meta-harness: an external LLM behind an OpenAI-compatible chat-completions API.

Every refresh sends the training statistics and the current constraints; the LLM replies with a
JSON object in the meta-harness schema, which is validated by ``HarnessState.from_dict``. The
trainer must never stall or crash because this backend is slow, down or creative, so *any*
failure (timeout, connection error, HTTP error, unparsable or schema-violating reply) keeps the
previous state unchanged, counts ``failures``, records ``last_error`` and logs a warning.

Retries (``max_retries``) cover transient failures: timeouts, connection errors, HTTP 429/5xx,
and invalid replies (the retry tells the model what was wrong, which fixes most schema slips).
Other 4xx errors (bad key, unknown model) are not retried: they will not fix themselves.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from typing import Any, Mapping

import requests

from score_lightning.harness.base import clean_stats
from score_lightning.harness.state import HarnessState, HarnessStateError

log = logging.getLogger(__name__)

SYSTEM_PROMPT = """\
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
 "notes": "one or two sentences to the evaluator explaining what to focus on and why"}
Rules: 1 <= k <= pool size; len(must_include) <= k; 0 <= weight_min <= weight_max <= 1; \
k*weight_min <= 1 <= k*weight_max; 0 <= min_number_of_tool_call <= 10. Do not include \
"dimension_pool" or "version".

How to react to the statistics (all in [0, 1] unless noted; a missing statistic means no evidence):
- verified_rate low (evaluator rarely verifies claims by search): require_verification = true and \
raise min_number_of_tool_call by 1; consider citation_cross_check = true.
- consistency high (> 0.8) or reward_std very low (< 0.05): the rubric is saturated and no longer \
separates reports; raise k by 1 and require_gap_analysis = true.
- rubric_valid_rate low: the evaluator cannot satisfy the weight bounds; widen them (lower \
weight_min, raise weight_max).
- answer_valid_rate low or tool_calls_mean far below min_number_of_tool_call: the solver struggles; \
do not tighten further this round.
- entropy falling fast with rising reward_mean: the solver may be exploiting the evaluator; prefer \
verification and citation cross-checks.
- when everything is healthy, move gently back toward the current defaults; change little at a time.
"""


class LLMHarness:
    """OpenAI-compatible meta-harness client (``POST {base_url}/chat/completions``)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout_s: float = 30.0,
        max_retries: int = 1,
        temperature: float = 0.0,
        max_tokens: int | None = 1024,
        retry_backoff_s: float = 1.0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if max_retries < 0 or timeout_s <= 0:
            raise ValueError("harness: need max_retries >= 0 and timeout_s > 0")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.retry_backoff_s = retry_backoff_s
        self.extra_body = dict(extra_body or {})
        self.failures = 0
        self.last_error = ""

    # ------------------------------------------------------------------ public API
    def update(self, state: HarnessState, stats: Mapping[str, float]) -> HarnessState:
        """One refresh: a new state with version + 1, or ``state`` itself when every attempt failed."""
        messages = self.build_messages(state, stats)
        error = ""
        for attempt in range(self.max_retries + 1):
            if attempt and self.retry_backoff_s > 0:
                time.sleep(self.retry_backoff_s * attempt)
            try:
                content = self._post(messages)
            except _Permanent as exc:
                error = str(exc)
                break
            except _Transient as exc:
                error = str(exc)
                continue
            try:
                return parse_reply(content, state)
            except (HarnessStateError, ValueError) as exc:
                error = f"invalid reply: {exc}"
                # Show the model its own reply and the reason, so a retry can correct it.
                messages = [*messages, {"role": "assistant", "content": content},
                            {"role": "user", "content": f"That reply was rejected ({exc}). "
                             "Reply again with one corrected JSON object only."}]
        self.failures += 1
        self.last_error = error
        log.warning("meta-harness refresh failed (%s); keeping constraints version %d", error, state.version)
        return state

    def build_messages(self, state: HarnessState, stats: Mapping[str, float]) -> list[dict[str, str]]:
        """System prompt plus one user message with the statistics and the current constraints.

        The pool is sent as names only: definitions are long and the harness never picks dimensions.
        """
        current = state.to_dict(include_pool=False)
        current.pop("version", None)
        payload = {
            "statistics": {k: round(v, 4) for k, v in sorted(clean_stats(stats).items())},
            "current_constraints": current,
            "dimension_pool": list(state.dimension_pool),
            "refresh": state.version + 1,
        }
        user = (
            "Training statistics over the last window and the constraints currently in force:\n"
            + json.dumps(payload, indent=2)
            + "\nReply with the new constraints as one JSON object."
        )
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    # ------------------------------------------------------------------ HTTP
    def _post(self, messages: list[dict[str, str]]) -> str:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self.extra_body)
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        try:
            resp = requests.post(self.url, json=body, headers=headers, timeout=self.timeout_s)
        except requests.Timeout as exc:
            raise _Transient(f"timeout: no reply from {self.url} within {self.timeout_s}s") from exc
        except requests.ConnectionError as exc:
            raise _Transient(f"connection error to {self.url}: {exc}") from exc
        except requests.RequestException as exc:
            raise _Permanent(f"request to {self.url} failed: {exc}") from exc
        if resp.status_code >= 400:
            msg = f"HTTP {resp.status_code} from {self.url}: {resp.text[:200]}"
            if resp.status_code == 429 or resp.status_code >= 500:
                raise _Transient(msg)
            raise _Permanent(msg)
        try:
            content = resp.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise _Transient(f"malformed response (missing choices[0].message.content): {resp.text[:200]}") from exc
        if not isinstance(content, str):
            raise _Transient("malformed response: choices[0].message.content is not a string")
        return content


class _Transient(Exception):
    """Worth retrying."""


class _Permanent(Exception):
    """Retrying cannot help (bad key, unknown model, invalid request)."""


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def extract_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text``; tolerates ```json fences, prose and ``<think>`` blocks."""
    text = _THINK.sub("", text)
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    raise ValueError(f"no JSON object in reply: {text[:200]!r}")


def parse_reply(content: str, state: HarnessState) -> HarnessState:
    """Validate an LLM reply against the schema; the pool stays from ``state`` unless given."""
    data = extract_json_object(content)
    data.pop("version", None)  # the harness, not the LLM, counts refreshes
    if "dimension_constraints" not in data and "process_constraints" not in data:
        raise HarnessStateError("reply has neither dimension_constraints nor process_constraints")
    new = HarnessState.from_dict(data, base=state)
    new.version = state.version + 1
    return new
