"""Audit: the torch-free auditor (the chain, the release assets, its command line) and the release-asset builder,
which writes what the auditor verified and re-audits it before anything is moved into place.

May import every stage below it: :mod:`harness.evidence`, :mod:`harness.qualify`, :mod:`harness.install`,
:mod:`harness.build` and :mod:`harness.core`.
"""
