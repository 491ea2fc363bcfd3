"""Benchmark scripts (not tests): ``python3 bench/run.py`` prints the performance table."""
