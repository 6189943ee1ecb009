# The README's two commands: `make demo` (the main job on the embedded demo data) and `make test`.
# Both set up the environment on first use (tools/setup_env.sh) and reuse it afterwards.
VENV ?= $(or $(SOFTFREE_VENV),.venv)
export SOFTFREE_VENV := $(VENV)
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# the test files are spread over this many processes (pytest-xdist, whole files per worker); 0 = one process
TEST_WORKERS ?= 2

.PHONY: setup demo test test-cluster test-pythons newest lock gpu-check clean

setup:
	bash tools/setup_env.sh

DEMO_DIR ?= work_dirs/demo
DEMO_ARGS ?=
# det (default): the detector, about 4 minutes on 2 cores; all: both halves of the main job (detector and segmentor,
# about 9 minutes); seg: the segmentor only (about 6 minutes)
TASK ?= det

# the main job on the embedded digits data (tools/run_demo.py: one progress line per step, their logs and commands
# in $(DEMO_DIR); DEMO_ARGS=--verbose prints the logs): demo data -> XCiT-T12/16 poly3 classifier pretraining
# (mmpretrain) -> Mask R-CNN (mmdet) and Semantic FPN (mmseg) from that checkpoint -> COCO bbox / segm AP and mIoU ->
# predictions drawn on val images -> a summary (top-1, AP, mIoU, time of each step, picture folders)
demo: setup
	$(PY) tools/run_demo.py --work-dir $(DEMO_DIR) --task $(TASK) $(DEMO_ARGS)

test: setup
	$(PY) -m pytest tests -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 --ignore=tests/cluster $(PYTEST_ARGS)

# the cluster tests (tests/cluster/, about 10 minutes on 2 cores): the warm-start chain on a real one-node Slurm that
# tools/slurm_local.sh starts here (it installs slurm-wlm and munge where missing: root and apt) and stops by PID, as
# srun jobs and submitted through submitit (signalled, requeued, preempted, resumed). They skip where Slurm cannot start; SOFTFREE_MM_REQUIRE_CLUSTER=1 (.ci/run)
# makes that a failure
test-cluster: setup
	$(PY) -m pytest tests/cluster -q -p no:cacheprovider -rs --durations=0 $(PYTEST_ARGS)

# the other supported Pythons this machine has (setup.py's PYTHONS but the one of $(VENV); found on PATH or under
# pyenv): each sets up its own .venv-3.X and runs a slice of the suite (tools/test_pythons.sh says which and why);
# PYTHONS="python3.12 /opt/py313/bin/python3" names them instead
test-pythons: setup
	bash tools/test_pythons.sh

# the newest versions the loose requirements (requirements/*.txt) allow, on purpose: on every supported Python a venv
# from them (.venv-newest-3.X, SOFTFREE_LOCK=none) runs test-pythons' slice; what passed is recorded in
# work_dirs/newest/ (about 10 minutes per Python here). Then `make lock` writes requirements/lock/ from those records
# (tools/lock.sh: uv pip compile, exact versions with hashes), which `make setup` installs
newest:
	NEWEST=1 bash tools/test_pythons.sh

lock:
	bash tools/lock.sh

# on a CUDA machine: set-up (offline from GPU_CHECK_WHEELS where the node has no package index), the fused-kernel
# and CUDA-only tests, kernels vs SDPA (bf16, fp32, N = 1k..64k), a Mask R-CNN training step against mmdet's
# backbones, one summary file (7 minutes: bash tools/gpu_check.sh --plan); without CUDA it stops at once with one line
gpu-check:
	bash tools/gpu_check.sh

clean:
	rm -rf work_dirs data/demo
