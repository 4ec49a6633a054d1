"""Benchmarks of the agent's stages; figures and how they were taken: BENCHMARKS.md.

Each bench is a module run from the repository root, which puts the root on ``sys.path``:
``.venv/bin/python -m bench.bench_series`` (root and a lab: ``bench_datapath``, ``soak``).
They import only the package (``agent``, ``tools``) and ``tests.fixtures``.
"""
