"""Analysis code behind tools/ (benchmarks)."""
