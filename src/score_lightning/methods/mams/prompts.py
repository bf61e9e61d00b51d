"""The three MaMs solver roles (search, state, report): their prompts and the parsers of their outputs.

MaMs (multi-agent Markov-state workflow) prompts the *same* policy in three roles. Each prompt is
the Markov state of the workflow, never its history: the question, the memory, the plan, the
current report and (for the state role) one chunk of the newest observation. That keeps every
prompt bounded however many searches and however long the observations get.

Formats (new tags; they are several tokens in the tiny tokenizer, whose single-token protocol tags
are left unchanged so the default checkpoint and cold start stay identical):

* search: ``<think>…</think>`` optionally, then ``<search>query</search>`` or ``<finish/>``;
* state: ``<memory>facts with [doc_id]s</memory><plan>what next</plan>`` (replaces the old state);
* report: ``<report>the whole current report, ending with "Conclusion: …"</report>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from score_lightning.protocol import SEARCH_CLOSE, SEARCH_OPEN, THINK_CLOSE, THINK_OPEN
from score_lightning.roles.prompts import CONCLUSION_INSTRUCTION, Message

MEMORY_OPEN, MEMORY_CLOSE = "<memory>", "</memory>"
PLAN_OPEN, PLAN_CLOSE = "<plan>", "</plan>"
REPORT_OPEN, REPORT_CLOSE = "<report>", "</report>"
FINISH = "<finish/>"

MAMS_SEARCH_SYSTEM = (
    "You are the search agent of a research team. Decide the next step from the question, the team's "
    "memory, plan and current report.\n"
    f"- You may think first inside {THINK_OPEN}...{THINK_CLOSE}.\n"
    f"- Then either write one query as {SEARCH_OPEN}query{SEARCH_CLOSE}, or write {FINISH} when the report "
    "answers the question. At most {max_searches} searches."
)
MAMS_STATE_SYSTEM = (
    "You are the state agent of a research team. Read one chunk of search results and rewrite the team's "
    "state in this format:\n"
    f"{MEMORY_OPEN}facts worth keeping, each with its [doc_id]{MEMORY_CLOSE}{PLAN_OPEN}what to search or "
    f"write next{PLAN_CLOSE}\n"
    "The new memory replaces the old one: keep what still matters, add what the chunk shows, stay short."
)
MAMS_REPORT_SYSTEM = (
    "You are the report agent of a research team. Rewrite the report from the team's memory: keep what is "
    "right, add the new facts, cite the [doc_id]s the memory gives for them.\n"
    f"Output the whole report as {REPORT_OPEN}...{REPORT_CLOSE}.\n"
)

EMPTY = "(empty)"


def _section(title: str, text: str) -> str:
    return f"{title}:\n{text.strip() or EMPTY}"


def search_messages(query: str, memory: str, plan: str, report: str, searches: int, max_searches: int) -> list[Message]:
    """The search role: decide the next query (or finish) from the state, not from the observations."""
    user = "\n\n".join((f"Question: {query.strip()}", f"Searches so far: {searches} of {max_searches}.",
                        _section("Memory", memory), _section("Plan", plan), _section("Report so far", report)))
    return [{"role": "system", "content": MAMS_SEARCH_SYSTEM.format(max_searches=max_searches)},
            {"role": "user", "content": user}]


def state_messages(query: str, search: str, memory: str, plan: str, chunk: str, index: int, total: int) -> list[Message]:
    """The state role: fuse chunk ``index`` of ``total`` of the newest observation into memory and plan."""
    user = "\n\n".join((f"Question: {query.strip()}", f"Search: {search.strip()}", _section("Memory", memory),
                        _section("Plan", plan), _section(f"Results (chunk {index} of {total})", chunk)))
    return [{"role": "system", "content": MAMS_STATE_SYSTEM}, {"role": "user", "content": user}]


def report_messages(query: str, rubric_text: str, memory: str, plan: str, report: str,
                    conclusion_line: bool = True) -> list[Message]:
    """The report role: extend the report from memory (never from raw observations), under the rubric."""
    system = MAMS_REPORT_SYSTEM + (CONCLUSION_INSTRUCTION if conclusion_line else "")
    user = "\n\n".join((f"Question: {query.strip()}", _section("Rubric", rubric_text), _section("Memory", memory),
                        _section("Plan", plan), _section("Report so far", report)))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def prompt_section(prompt: str, title: str) -> str:
    """The body of a role prompt's ``Title:`` section (``""`` when absent or empty): scripts and demos read
    the Markov state back from the prompt, so they need no state of their own."""
    m = re.search(rf"{re.escape(title)}:\n(.*?)(?:\n\n|\Z)", prompt, re.DOTALL)
    body = m.group(1).strip() if m else ""
    return "" if body == EMPTY else body


@dataclass(frozen=True)
class StateParse:
    valid: bool
    memory: str = ""
    plan: str = ""
    error: str = ""


_STATE_RE = re.compile(re.escape(MEMORY_OPEN) + r"(.*?)" + re.escape(MEMORY_CLOSE) + r"\s*" + re.escape(PLAN_OPEN)
                       + r"(.*?)" + re.escape(PLAN_CLOSE), re.DOTALL)
_REPORT_RE = re.compile(re.escape(REPORT_OPEN) + r"(.*?)" + re.escape(REPORT_CLOSE), re.DOTALL)
_NESTED = (SEARCH_OPEN, MEMORY_OPEN, PLAN_OPEN, REPORT_OPEN, "<observation>", "<answer>")


def parse_state(text: str) -> StateParse:
    """The last ``<memory>…</memory><plan>…</plan>`` pair; invalid when absent or when memory is empty."""
    found = _STATE_RE.findall(text)
    if not found:
        return StateParse(False, error=f"no {MEMORY_OPEN}…{MEMORY_CLOSE}{PLAN_OPEN}…{PLAN_CLOSE}")
    memory, plan = (s.strip() for s in found[-1])
    if not memory:
        return StateParse(False, error="empty memory")
    if any(t in memory or t in plan for t in _NESTED):
        return StateParse(False, error="nested tag inside the state")
    return StateParse(True, memory, plan)


def parse_report(text: str) -> str | None:
    """The report body of a closed ``<report>…</report>`` block, ``None`` when unclosed, empty or nested."""
    found = _REPORT_RE.findall(text)
    body = found[-1].strip() if found else ""
    if not body or REPORT_OPEN in body or any(t in body for t in _NESTED):
        return None
    return body
