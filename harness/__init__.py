"""Torch-free release engineering for miniverl.

The harness never imports miniverl or torch: it builds the candidate, installs it into a fresh
virtual environment and drives the *installed* ``miniverl`` executable as subprocesses.
"""
