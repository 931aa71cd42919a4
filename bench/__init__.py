"""Benchmarks that print figures (``make bench``). Each ``bench/bench_*.py`` has ``run()``."""
