# `make demo`'s detector (maskrcnn_xcit_t12_poly3_demo.py) with its poly3 backbone from the warm start at demo scale
# instead of a poly3 classifier trained from scratch: stage 2's work dir (configs/demo/finetune_xcit_t12_poly3_demo.py;
# its last checkpoint). `python tools/warm_start.py configs/demo/maskrcnn_xcit_t12_poly3_warm_demo.py` runs the
# chain: stage 1, stage 2, this config. 1 process (CPU) x 4 images.
_base_ = './maskrcnn_xcit_t12_poly3_demo.py'
model = dict(backbone=dict(init_cfg=dict(checkpoint='work_dirs/finetune_xcit_t12_poly3_demo')))
