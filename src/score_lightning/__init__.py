"""score-lightning: SCORE (joint generation and evaluation) for deep-research agents on PyTorch Lightning."""

__version__ = "0.1.0"
