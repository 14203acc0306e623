"""Evidence: the deterministic evidence archive (roles to members, its manifest, bounded extraction) and the seed's
canonical release-asset layout.

May import :mod:`harness.qualify`, :mod:`harness.install`, :mod:`harness.build` and :mod:`harness.core`.
"""
