"""Benchmarks: the job on the standard shape, measured against baselines in the same run."""
