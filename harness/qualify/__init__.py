"""Qualify: drive the installed CLI (release smoke and the full workloads under ``full/``), record every invocation
(transcript), judge the evidence, and write ``qualification.json``.

May import :mod:`harness.install`, :mod:`harness.build` and :mod:`harness.core`.
"""
