"""What a smoke or full qualification is asked to do: the options ``python -m harness smoke|full`` parsed.

Below both the smoke driver (:mod:`harness.qualify.smoke`) and the qualification writer
(:mod:`harness.qualify.qualification`), which records some of them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from harness.build.stacks import KNOWN_GOOD_DIR
from harness.core.proc import REPO_ROOT
from harness.core.records import Profile
from harness.install.vllm_site import VllmSite


@dataclass(frozen=True)
class SmokeOptions:
    profile: Profile
    out: Path
    level: str = "release_smoke"
    candidate: Path | None = None
    repo: Path = REPO_ROOT
    base_python: Path = Path(sys.executable)
    system_site_packages: bool = False
    offline_wheels: Path | None = None
    known_good_dir: Path = KNOWN_GOOD_DIR
    work: Path | None = None
    keep_work: bool = False
    model_cache: Path | None = None
    grpo: bool = True
    # The python of verl 0.9.1's own environment: the full level refuses to start without it (the handoff
    # diagnosis runs there, with the candidate overlaid by harness.install.verl_env); the smoke does not use it.
    verl_python: Path | None = None
    # A vLLM site the full workloads' CLI processes see after the venv's own site (harness.install.vllm_site),
    # digested when the option was read; None: vllm stays absent and plan refuses rollout.backend vllm.
    vllm_site: VllmSite | None = None
