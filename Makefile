# Benchmarks against docs/benchmarks.md#targets (issues 5 and 7); results go in docs/benchmarks.md.
PYTHON ?= python3

.PHONY: bench bench-quick

bench:
	$(PYTHON) bench/run_all.py

bench-quick:
	$(PYTHON) bench/run_all.py --quick
