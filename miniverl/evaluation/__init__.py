"""Held-out evaluation: ``miniverl eval`` (trained adapter against its base) and ``algorithm.eval_every``."""

from miniverl.evaluation.scoring import Decoding, difference, flat_metrics, periodic_evaluator, summarize

__all__ = ["Decoding", "difference", "flat_metrics", "periodic_evaluator", "summarize"]
