"""--system-site-packages over a base python that is itself a venv (the H200's /opt/torch/.venv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.install.venv import PARENT_SITE_PTH, InstallOptions, fresh_venv


def test_packages_of_a_parent_venv_are_visible_after_the_venvs_own(tmp_path: Path) -> None:
    parent = tmp_path / "parent"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(parent)], check=True)
    site = subprocess.run(
        [str(parent / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "machine_only_module.py").write_text("ORIGIN = 'parent venv'\n")
    work = tmp_path / "work"
    work.mkdir()
    options = InstallOptions(base_python=parent / "bin" / "python", constraint=None, system_site_packages=True)
    python = fresh_venv(work / "venv", options, work=work)
    probe = "import machine_only_module as m, sys; print(m.ORIGIN); print(sys.path.index(m.__file__.rsplit('/', 1)[0]))"
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == ["parent", "venv"]
    own = subprocess.run(
        [str(python), "-c", "import sysconfig, sys; print(sys.path.index(sysconfig.get_path('purelib')))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert int(own) < int(out[2]), "the qualification venv's own site-packages must come first"
    assert list((work / "venv").rglob(PARENT_SITE_PTH))


def test_no_pth_without_system_site_packages(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    options = InstallOptions(base_python=Path(sys.executable), constraint=None, system_site_packages=False)
    fresh_venv(work / "venv", options, work=work)
    assert not list((work / "venv").rglob(PARENT_SITE_PTH))
