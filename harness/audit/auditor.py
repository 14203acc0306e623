"""The auditor's one entry: the chain verification, plus the release-asset checks when an asset dir is given."""

from __future__ import annotations

from harness.audit.assets import audit_assets
from harness.audit.chain import verify_chain
from harness.audit.request import AuditRequest, validate_request
from harness.core.audit_records import ReleaseVerification
from harness.core.errors import UsageError


def audit(req: AuditRequest) -> ReleaseVerification:
    """The chain verification, plus every release-asset check when ``assets_dir`` is given (and the gate record's
    checks when ``gate_record`` is given too)."""
    if req.gate_record is not None and req.assets_dir is None:
        raise UsageError(
            "--gate-record needs --assets-dir: the gate record is compared with the statements among the assets",
            check="usage",
        )
    if req.assets_dir is None:
        return verify_chain(req)
    validate_request(req)
    return audit_assets(req)
