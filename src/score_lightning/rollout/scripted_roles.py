"""The scripted engine's roles beyond the core's three (rubric, solver, scoring): a registry the methods fill.

Why: :class:`~score_lightning.rollout.scripted.ScriptedEngine` (``rollout=scripted``, the tests' engine) tells a
request's role from its system prompt, and :class:`~score_lightning.rollout.scripted.ProtocolResponder` answers it so
that every experiment's steps run with non-zero rewards. A method whose prompts the step sends (MaMs's roles, RLER's
items, a step judgement ...) registers a :class:`ScriptedRole` under its role name in :data:`SCRIPTED_ROLES`, in its
own package, so this layer names none of them. Like the rest of the script, an answer depends only on the request.
The helpers below are what the methods' scripts share with the core's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from score_lightning.registry import Registry
from score_lightning.rollout.script_request import ScriptRequest

_WORD_RE = re.compile(r"[A-Za-z_.]+")
#: ``[id] `` heading a passage of an observation (what a search returned, not a citation)
OBS_ID_RE = re.compile(r"(?:^|<observation>)\[([^\]\s]+)\] ", re.MULTILINE)
#: ``[id] `` at the head of a line of a chunk or a passage list
LINE_ID_RE = re.compile(r"(?:^|\n)\[([^\]\s]+)\] ")


@dataclass(frozen=True)
class ScriptedRole:
    """A prompt the scripted engine recognises, and the default script's answer to it."""

    #: the role's system prompt: the first 60 characters of its first line, found in a prompt, identify the role
    system: str
    respond: Callable[[ScriptRequest], str]


#: role name (``ScriptRequest.role``) -> its recognition and default answer; filled by the methods' packages
SCRIPTED_ROLES: Registry[ScriptedRole] = Registry("scripted role")


def system_marker(system: str) -> str:
    """What identifies a system prompt inside a decoded prompt."""
    return system.split("\n", 1)[0][:60]


def script_words(query: str) -> str:
    """The query's first four words: what a scripted search looks for and a scripted report is about."""
    return " ".join(_WORD_RE.findall(query)[:4]) or "python"


def word_set(text: str) -> set[str]:
    """``text``'s words, lower-cased (a scripted judge's overlap measure)."""
    return {w.lower() for w in _WORD_RE.findall(text)}
