"""Hand off to verl 0.9: compile a miniverl plan into a typed IR and a verl config, write a launch
bundle, and diagnose it locally against the installed verl (no Ray, no GPU). See README.md here."""

from miniverl.handoff.ir import COMPILER_V1, ExperimentIR, ir_digest
from miniverl.handoff.rules import HandoffRefusal, load_rules, rules_digest

__all__ = ["COMPILER_V1", "ExperimentIR", "HandoffRefusal", "ir_digest", "load_rules", "rules_digest"]
