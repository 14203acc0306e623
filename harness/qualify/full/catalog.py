"""The implemented full workloads, by registry name (the registry says what each must prove), and the explicit
evidence layout their records use."""

from __future__ import annotations

from harness.core import policy, registry
from harness.qualify.full import (
    backend_matrix,
    direct_config,
    direct_gkd,
    grpo_cycles,
    pg_k1,
    ppo_rm_handoff,
    product_workflows,
    smollm2,
)
from harness.qualify.full.base import Workload

_IMPLEMENTED: tuple[Workload, ...] = (
    direct_gkd.WORKLOAD,
    pg_k1.WORKLOAD,
    smollm2.WORKLOAD,
    backend_matrix.WORKLOAD,
    grpo_cycles.WORKLOAD,
    ppo_rm_handoff.WORKLOAD,
    product_workflows.WORKLOAD,
    direct_config.WORKLOAD,
)
WORKLOADS: dict[str, Workload] = {w.name: w for w in _IMPLEMENTED}

# The version-specific folder of each subordinate workload record inside the evidence archive.
SUBORDINATE_FOLDERS = {
    "backend-matrix": "v011",
    "grpo-cycles": "v012",
    "ppo-rm-handoff": "v013",
    "product-workflows": "v014",
    "direct-config": "v015",
}


def implemented(name: str) -> Workload | None:
    return WORKLOADS.get(name)


def evidence_role(workload: str, role: str) -> str:
    """The qualification artifact role of one workload's evidence file."""
    return f"{workload}.{role}"


def archive_members() -> dict[str, str]:
    """Artifact role -> archive member, for every full workload's evidence and subordinate record."""
    members = {
        evidence_role(w.name, role): member for w in WORKLOADS.values() for role, member in sorted(w.evidence.items())
    }
    for spec in registry.REGISTRY.workloads:
        if spec.asset_role == "subordinate":
            members[policy.record_artifact_role(spec)] = f"{SUBORDINATE_FOLDERS[spec.name]}/{spec.principal_record}"
    return members


def qualification_paths() -> dict[str, str]:
    """Artifact role -> path inside the qualification directory: subordinate records at the top, evidence under
    evidence/ at its archive member name."""
    records = {
        policy.record_artifact_role(spec): spec.principal_record
        for spec in registry.REGISTRY.workloads
        if spec.asset_role == "subordinate"
    }
    return {role: records.get(role, f"evidence/{member}") for role, member in archive_members().items()}
