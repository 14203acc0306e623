"""Qualification profiles: the required GPU, the known-good stack, thresholds, release authority."""

from __future__ import annotations

from harness.core.errors import UsageError
from harness.core.jsonio import sha256_bytes
from harness.core.recordio import record_bytes
from harness.core.records import Profile, Thresholds

GIB = 1 << 30
MIB = 1 << 20


# Every profile: teardown within max(2 MiB, 2 % of the baseline). A CUDA profile's peak reserved is held to the
# 14.5 GiB budget of the seed's 16 GiB release card, the H200 included (the release smoke must still fit the card).
RELEASE_CARD_PEAK_RESERVED_BYTES = int(14.5 * GIB)


def _thresholds(peak_reserved_bytes_max: int | None) -> Thresholds:
    return Thresholds(
        peak_reserved_bytes_max=peak_reserved_bytes_max,
        teardown_tolerance_bytes_min=2 * MIB,
        teardown_tolerance_fraction=0.02,
    )


def _profile(
    name: str,
    *,
    required_gpu_name: str | None,
    can_authorize_release: bool,
    description: str,
    vllm: bool = False,
) -> Profile:
    """A profile whose known-good stack bears its name; a GPU profile runs on CUDA with the CUDA extras, and with
    ``vllm`` installs vLLM too (where the policy requires ``vllm_boundary``)."""
    cuda = required_gpu_name is not None
    return Profile(
        kind="miniverl.profile",
        schema_version=1,
        name=name,
        device="cuda" if cuda else "cpu",
        required_gpu_name=required_gpu_name,
        known_good=name,
        install_extras=(["train", "cuda"] if cuda else ["train"]) + (["vllm"] if vllm else []),
        thresholds=_thresholds(RELEASE_CARD_PEAK_RESERVED_BYTES if cuda else None),
        can_authorize_release=can_authorize_release,
        description=description,
    )


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        _profile(
            "rtx4080-wsl2-cu130",
            required_gpu_name="NVIDIA GeForce RTX 4080",
            can_authorize_release=True,
            description=(
                "The seed's release runner: Ubuntu under WSL2, Python 3.12.13, one 16 GiB RTX 4080, with vLLM "
                "installed. Its stack is declared here, not measured; a declared stack cannot authorize a release."
            ),
            vllm=True,
        ),
        # The seed names one release machine; the H100 and H200 are measured here but can never authorize a release.
        _profile(
            "h200-cu130",
            required_gpu_name="NVIDIA H200",
            can_authorize_release=False,
            description=(
                "The H200 machine measured here (no network; torch 2.11 cu130 system-wide, the venv uses "
                "--system-site-packages). Peak reserved is held to the 14.5 GiB budget of the 16 GiB release card."
            ),
        ),
        _profile(
            "h100-cu130",
            required_gpu_name="NVIDIA H100 80GB HBM3",
            can_authorize_release=False,
            description=(
                "The H100 machine measured here: the H200's image on an H100 80GB HBM3 (no network; torch 2.11 "
                "cu130 system-wide, the venv uses --system-site-packages). The same thresholds, scale and required "
                "checks as h200-cu130; peak reserved is held to the 14.5 GiB budget of the 16 GiB release card."
            ),
        ),
        _profile(
            "cpu-reference",
            required_gpu_name=None,
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
