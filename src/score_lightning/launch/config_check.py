"""Check a command line's config before Hydra runs it: every problem at once, in one ``error: invalid config:`` block.

Why before Hydra: Hydra stops at the first bad override with a traceback-shaped message, refuses a typo such as
``solver.num_rollout=4`` by suggesting ``+solver.num_rollout=4`` (which it then accepts and ignores), and never
says which key was meant. Here the groups are composed first, then each override is applied on its own, so a
wrong type, an unknown key (with or without ``+``, with the nearest known keys), a value outside its range and a
broken cross-key rule are all reported together, in seconds, before torch loads.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from score_lightning.launch.schema_checks import known_keys, unknown_key_line

_TYPE_WORDS = {"IntegerNode": "an integer", "FloatNode": "a number", "BooleanNode": "true or false",
               "StringNode": "a string", "EnumNode": "one of its names"}


def _is_group(key: str, config_dir: Path) -> bool:
    return (config_dir / key.split("@")[0]).is_dir()


def _type_line(cfg: DictConfig, key: str, raw: str, exc: BaseException) -> str:
    parent_key, _, leaf = key.rpartition(".")
    try:
        from omegaconf import OmegaConf

        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
        node_type = type(parent._get_node(leaf)).__name__
    except Exception:
        node_type = ""
    cause = exc.__cause__ or exc
    what = _TYPE_WORDS.get(node_type) or str(cause).splitlines()[0]
    if node_type == "" and "not in" in str(cause):
        return unknown_key_line(key, known_keys(cfg))
    return f"{key}={raw}: allowed {what}"


def command_line_problems(overrides: list[str], config_dir: Path | None = None) -> tuple[list[str], DictConfig | None]:
    """The problems of ``python src/train.py <overrides>``, and the config they leave (bad overrides skipped)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from score_lightning.launch.schema import compose_config
    from score_lightning.paths import CONFIG_DIR

    config_dir = Path(config_dir or CONFIG_DIR)
    parser = OverridesParser.create()
    problems: list[str] = []
    groups, values = [], []
    for line in overrides:
        try:
            parsed = parser.parse_overrides([line])[0]
        except HydraException as exc:
            problems.append(f"{line}: {str(exc).splitlines()[0]}")
            continue
        key = parsed.key_or_group
        if key.startswith("hydra.") or key.startswith("hydra/") or key == "hydra":
            continue
        (groups if _is_group(key, config_dir) else values).append((line, parsed))
    try:
        cfg = compose_config([line for line, _ in groups], config_dir)
    except HydraException as exc:
        return problems + [" ".join(str(exc).split("Config search path")[0].split())], None
    known = known_keys(cfg)
    for line, parsed in values:
        key = parsed.key_or_group
        if parsed.is_delete():
            apply = [parsed]
        else:
            if not parsed.is_add() and not parsed.is_force_add() and key not in known:
                problems.append(unknown_key_line(key, known))
                continue
            apply = parser.parse_overrides([f"++{line.lstrip('+')}"])
        try:
            ConfigLoaderImpl._apply_overrides_to_config(apply, cfg)
        except HydraException as exc:
            raw = line.split("=", 1)[1] if "=" in line else ""
            problems.append(_type_line(cfg, key, raw, exc))
    return problems, cfg


def check_command_line(overrides: list[str]) -> None:
    """Raise :class:`ConfigError` listing every problem of the command line: its overrides, the schema's checks and
    the rules across keys, in one block. None of them loads torch (a registry-backed name is checked against the
    names the core and the methods declare), so a refusal takes about as long as Python and Hydra take to start."""
    from score_lightning.errors import ConfigError
    from score_lightning.launch.config_validation import validate_config

    problems, cfg = command_line_problems(overrides)
    if cfg is not None and str(cfg.ckpt_path) == "last":  # as the run will read it (launch/runs.resolve_resume)
        from omegaconf import open_dict

        from score_lightning.launch.runs import latest_checkpoint

        task_dir = Path(cfg.paths.log_dir) / str(cfg.task_name)
        found = latest_checkpoint(task_dir)
        with open_dict(cfg):
            cfg.ckpt_path = None if found is None else str(found)
        if found is None:
            problems.append(f"ckpt_path=last: no checkpoints/last.ckpt below {task_dir}; give the checkpoint's path "
                            "instead")
    if cfg is not None:
        try:
            validate_config(cfg, ask_registries=False)
        except ConfigError as exc:
            problems += [line[4:] for line in str(exc).splitlines()[1:] if line.startswith("  - ")]
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(dict.fromkeys(problems)))
