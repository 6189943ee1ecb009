# The README's two commands: `make demo` (the main job on the embedded demo data) and `make test`.
# Both set up the environment on first use (tools/setup_env.sh) and reuse it afterwards.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test gpu-check clean

setup:
	bash tools/setup_env.sh

DEMO_CFG ?= configs/demo/maskrcnn_xcit_s12_poly3_demo.py
DEMO_DIR ?= work_dirs/maskrcnn_xcit_s12_poly3_demo
TRAIN_ARGS ?=

# make the demo data, train the demo Mask R-CNN (XCiT-S12, poly3) on CPU, evaluate it: COCO bbox and segm AP
demo: setup
	$(PY) tools/make_demo_data.py
	$(PY) tools/train.py $(DEMO_CFG) --work-dir $(DEMO_DIR) $(TRAIN_ARGS)
	$(PY) tools/test.py $(DEMO_CFG) $$(cat $(DEMO_DIR)/last_checkpoint) --work-dir $(DEMO_DIR)

test: setup
	$(PY) -m pytest tests -q -p no:cacheprovider $(PYTEST_ARGS)

# on a CUDA machine: set-up, CUDA-only tests, kernel benchmark (fp32, bf16), 20 --amp iterations of the demo,
# a one-screen summary (about 8 minutes from a fresh clone); without CUDA it stops at once with one line
gpu-check:
	bash tools/gpu_check.sh

clean:
	rm -rf work_dirs data/demo
