"""Qualification profiles: the required GPU, the known-good stack, thresholds, release authority."""

from __future__ import annotations

from harness.core.errors import UsageError
from harness.core.jsonio import sha256_bytes
from harness.core.recordio import record_bytes
from harness.core.records import Profile, Thresholds

GIB = 1 << 30
MIB = 1 << 20


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            kind="miniverl.profile",
            schema_version=1,
            name="rtx4080-wsl2-cu130",
            device="cuda",
            required_gpu_name="NVIDIA GeForce RTX 4080",
            known_good="rtx4080-wsl2-cu130",
            install_extras=["train", "cuda"],
            thresholds=Thresholds(
                peak_reserved_bytes_max=int(14.5 * GIB),
                teardown_tolerance_bytes_min=2 * MIB,
                teardown_tolerance_fraction=0.02,
            ),
            can_authorize_release=True,
            description=(
                "The seed's release runner: Ubuntu under WSL2, Python 3.12.13, one 16 GiB RTX 4080. "
                "Its stack is declared here, not measured; a declared stack cannot authorize a release."
            ),
        ),
        Profile(
            kind="miniverl.profile",
            schema_version=1,
            name="h200-cu130",
            device="cuda",
            required_gpu_name="NVIDIA H200",
            known_good="h200-cu130",
            install_extras=["train", "cuda"],
            # The release smoke must still fit the 16 GiB release card, so the H200 keeps its budget.
            thresholds=Thresholds(
                peak_reserved_bytes_max=int(14.5 * GIB),
                teardown_tolerance_bytes_min=2 * MIB,
                teardown_tolerance_fraction=0.02,
            ),
            # The seed names one release machine; the H200 is measured here but can never authorize a release.
            can_authorize_release=False,
            description=(
                "The H200 machine measured here (no network; torch 2.11 cu130 system-wide, the venv uses "
                "--system-site-packages). Peak reserved is held to the 14.5 GiB budget of the 16 GiB release card."
            ),
        ),
        Profile(
            kind="miniverl.profile",
            schema_version=1,
            name="cpu-reference",
            device="cpu",
            required_gpu_name=None,
            known_good="cpu-reference",
            install_extras=["train"],
            thresholds=Thresholds(
                peak_reserved_bytes_max=None, teardown_tolerance_bytes_min=2 * MIB, teardown_tolerance_fraction=0.02
            ),
            can_authorize_release=False,
            description="CI on CPU: runtime correctness only. It can never authorize a release.",
        ),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UsageError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}", check="profile") from None


def profile_sha256(profile: Profile) -> str:
    return sha256_bytes(record_bytes(profile))
