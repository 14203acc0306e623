"""The harness's core: every file format (records, gate records, their JSON Schemas), canonical JSON and bounded,
symlink-safe I/O, subprocesses, errors, and the policy in code (profiles, workload registry, required checks).

Imports nothing else of the harness: every stage above (build, install, qualify, evidence, audit, gate) may use it.
"""
