"""What the schema alone refuses in a composed config: unknown keys (with the nearest known ones), and values
outside a field's range or allowed set. Types are OmegaConf's job when the YAML and the overrides merge.

Why a walk and not OmegaConf's errors: OmegaConf stops at the first problem, and Hydra lets ``+key=value`` add a
key a schema never declared; a user should see every problem at once, each with what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

from score_lightning.config.fields import value_problem

#: old keys a user may still type, and what to write instead
RENAMED = {
    "loss.clip_ratio_low": "optim.clip_ratio_low",
    "loss.clip_ratio_high": "optim.clip_ratio_high",
    "loss.norm_adv_by_std": "optim.scale_rewards (false meant none, true meant group)",
    "optim.warmup_ratio": "optim.warmup_steps and optim.warmup_start_ratio (warmup in SCORE steps, from lr x ratio)",
}


#: what a recipe leaves for the user to give (``???`` in its YAML), and where to read how
REQUIRED = {
    "data.queries_path": "your training queries, a JSONL file of {\"id\", \"prompt\"} per line (null: the 40 "
                         "embedded Python questions); docs/RECIPES.md, \"Your queries and your corpus\"",
    "retriever.url": "your search server's URL, e.g. http://HOST:8000/retrieve from python scripts/serve_retriever.py "
                     "--corpus FILE (or retriever=mcp for an MCP search tool); docs/RECIPES.md, \"Your queries and "
                     "your corpus\"",
}


def _typed(node: DictConfig) -> type | None:
    cls = OmegaConf.get_type(node)
    return cls if cls is not None and dataclasses.is_dataclass(cls) else None


def _walk(node: DictConfig, prefix: str = "") -> Iterator[tuple[str, DictConfig]]:
    """Every dict node with its dotted path (interpolations are not followed)."""
    yield prefix, node
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            yield from _walk(child, f"{prefix}{key}.")


def known_keys(cfg: DictConfig) -> list[str]:
    """Every dotted key the schema (or an open node's YAML) declares in ``cfg``."""
    out = []
    for prefix, node in _walk(cfg):
        cls = _typed(node)
        names = [f.name for f in dataclasses.fields(cls)] if cls else list(node.keys())
        out += [prefix + str(n) for n in names]
    return out


def nearest(key: str, known: list[str]) -> list[str]:
    """The known keys a typo most likely meant: close spellings of the whole path, else the same leaf elsewhere."""
    close = difflib.get_close_matches(key, known, n=2, cutoff=0.8)
    if close:
        return close
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [k for k in known if k.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return same_leaf[:2]
    parent = key.rsplit(".", 1)[0] + "." if "." in key else ""
    siblings = [k for k in known if k.startswith(parent) and "." not in k[len(parent):]]
    return [parent + m for m in difflib.get_close_matches(leaf, [k[len(parent):] for k in siblings], n=2, cutoff=0.6)]


def unknown_key_line(key: str, known: list[str]) -> str:
    if key in RENAMED:
        return f"{key}: removed; use {RENAMED[key]}"
    guess = nearest(key, known)
    hint = f"; did you mean {' or '.join(f'`{g}`' for g in guess)}?" if guess else ""
    return f"{key}: unknown key{hint}"


def registry_problem(path: str, value: Any, meta: dict, names: Mapping[str, Iterable[str]] | None,
                     live: Callable[[str], list[str]] | None) -> str | None:
    """A registry-backed field: the core's names, the methods' declared ones, else, with ``live``, the registry itself
    (a plug-in registered in this process: the import is paid only for a name nobody declared)."""
    known = set(meta["registry"]) | set((names or {}).get(path, ()))
    if value in known:
        return None
    if live is not None:
        known = set(live(path))
        if value in known:
            return None
    what = f"one of the registered {meta['registered']}: " if meta.get("registered") else ""
    line = f"{path}={value!r}: allowed {what}{', '.join(sorted(known))}"
    return line if live is not None else line + " (a method declares its names in its config.py, NAMES)"


def schema_problems(cfg: DictConfig, names: Mapping[str, Iterable[str]] | None = None,
                    live: Callable[[str], list[str]] | None = None) -> list[str]:
    """Unknown keys under schema nodes, and values outside their field's range or set, one line each. ``names``:
    the names each registry-backed key may take besides the core's (the methods'); ``live``: the registry's names
    when a value is neither."""
    problems, unknown = [], []
    for prefix, node in _walk(cfg):
        cls = _typed(node)
        if cls is None:
            continue
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in node.keys():
            if key not in fields:
                unknown.append(prefix + str(key))
                continue
            path = prefix + str(key)
            if path in REQUIRED and node._get_node(key)._is_missing():
                problems.append(f"{path}: required (no default; set it on the command line): {REQUIRED[path]}")
                continue
            meta = dict(fields[key].metadata)
            if not meta or "node" in meta:
                continue
            value = _value(node, key)
            if "registry" in meta:
                line = registry_problem(path, value, meta, names, live)
                if line is not None:
                    problems.append(line)
                continue
            kind = "an integer" if fields[key].type in (int, "int", Optional[int], "Optional[int]") else "a number"
            why = value_problem(value, meta, kind)
            if why is not None:
                reason = f" ({meta['why']})" if meta.get("why") else ""
                problems.append(f"{prefix}{key}={value!r}: allowed {why}{reason}")
    if unknown:
        known = known_keys(cfg)
        problems = [unknown_key_line(k, known) for k in unknown] + problems
    return problems


def _value(node: DictConfig, key: Any) -> Any:
    try:
        value = node[key]
    except Exception:  # a missing value or an unresolvable interpolation: other checks name it
        return None
    return value
