"""What the tools run on: config / data / CLI checks, device and cluster settings, the Runner's set-up, checkpoint
and data-file checks, the dry run, and the mmengine hooks (``engine.hooks``, registered by ``softfree_mm.registry``).
"""
