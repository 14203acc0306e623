"""miniverl: RL post-training and distillation for small language models on one device."""

__version__ = "0.1.0"
