# The README's two commands: `make demo` (the main job on the embedded demo data) and `make test`.
# Both set up the environment on first use (tools/setup_env.sh) and reuse it afterwards.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test clean

setup:
	bash tools/setup_env.sh

demo: setup
	$(PY) tools/demo.py

test: setup
	$(PY) -m pytest tests -q -p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf work_dirs data/demo
