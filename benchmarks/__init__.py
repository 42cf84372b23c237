"""Benchmarks of an implementation against the reference and Hugging Face Llama (``pytest benchmarks``).

``perf_checks`` holds the benchmark-backed graded checks; the other modules are what the
pytest-benchmark files share: configs, timing, and the side-by-side contenders.
"""
