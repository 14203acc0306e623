"""The seed's canonical release-asset layout: fixed public names, never derived from internal paths."""

from __future__ import annotations

from harness.build.candidate import MANIFEST, SUMS
from harness.core.policy import PRINCIPAL_FILES
from harness.evidence.archive import ARCHIVE, ARCHIVE_MANIFEST
from harness.evidence.statements import STATEMENTS

RELEASE_VERIFICATION = "release-verification.json"
QUAL_SUMS = "qualification-SHA256SUMS"
# The nine provenance and evidence assets, in the seed's canonical order (qualification-SHA256SUMS covers them).
QUALIFICATION_ASSETS = (
    MANIFEST,
    RELEASE_VERIFICATION,
    "qualification.json",
    *PRINCIPAL_FILES,
    ARCHIVE,
    ARCHIVE_MANIFEST,
)
# The two in-toto statements hash the assets themselves, so qualification-SHA256SUMS keeps the seed's nine.
TOP_LEVEL = frozenset({"dist", SUMS, QUAL_SUMS, *QUALIFICATION_ASSETS, *STATEMENTS})
