"""Build: the candidate (one wheel, one sdist, their manifest and SHA256SUMS, from ``git archive HEAD``), its check,
and the known-good stacks (pins and descriptors) a qualification installs against.

May import :mod:`harness.core` only.
"""
