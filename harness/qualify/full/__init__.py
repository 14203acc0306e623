"""Full-qualification workloads: each drives the installed CLI (``run``) and judges its own evidence (``judge``).

A workload never decides what it must prove: the checks it must pass come from the registry
(:mod:`harness.core.registry`) through :func:`harness.core.policy.required_checks`. ``judge`` is pure: it reads only
the evidence files ``run`` produced (and that the qualification binds by sha256), so the auditor can
re-derive every check from the archived evidence.
"""

from harness.qualify.full.base import Context, Judgement, Scale, Workload, WorkloadFailure

__all__ = ["Context", "Judgement", "Scale", "Workload", "WorkloadFailure"]
