"""Install: a fresh venv with the candidate wheel in it, the proof of where its import and executable come from
(origin), and verl's environment with the candidate overlaid.

May import :mod:`harness.build` and :mod:`harness.core`.
"""
