# maskrcnn / swin_t: the official Agent-Swin-T Mask R-CNN 1x (Agent Attention, ECCV 2024;
# downstream/detection/configs/agent_swin/agent_swin_t_mrcnn_1x_9-12-14-7.py): arch 'agent_tiny_downstream' of
# SoftFreeSwin: the classifier's weights with the detection set-up's agents 9x9 / 12x12 / 14x14 (downstream_agent_shapes;
# the agent biases resized to them and to each image's grid), agent attention over the whole feature map in stages 1-3,
# shifted softmax windows in stage 4.
# Recipe (official): AdamW lr 1e-4, wd 0.05 (no decay on norms and the six agent biases), drop path 0.1, 1x (12 epochs),
# multi-scale training, 8 GPUs x 2 images (total batch 16).
# Reported: box/mask AP 1x 44.6/40.7 (Agent-Attention detection README; Swin-T 1x 43.7/39.8).
# Parameters / FLOPs (tools/analysis/get_flops.py, 800x1280): ours 48.409M, 275.385 GFLOPs; reported 48M, 276G:
#   Agent-Attention detection README (mmcv 1.x's counter at 1280x800
#   plus the attention's products by hand; ours: mmengine's counter plus each kernel's declared cost).
# Backbone start: the official Agent-Swin-T release (ImageNet-1k), fetched and converted on load. To evaluate the official
#   detector: python tools/convert_checkpoint.py agent_swin RELEASE.pth OUT.pth --whole, then load_from=OUT.pth
#   (release: https://cloud.tsinghua.edu.cn/f/258e208469084e6abf26/?dl=1).
_base_ = './maskrcnn_swin_t_softmax.py'
agent_release = 'https://cloud.tsinghua.edu.cn/f/a2ddc1190c224f768a41/?dl=1'
model = dict(
    backbone=dict(
        arch='agent_tiny_downstream',
        attn_cfg=None,
        global_window=None,
        drop_path_rate=0.1,
        init_cfg=dict(checkpoint=agent_release)))
no_decay = dict(decay_mult=0.)
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={
    'absolute_pos_embed': no_decay, 'pos_embed': no_decay, 'relative_position_bias_table': no_decay,
    'cls_token': no_decay, 'temperature': no_decay, 'an_bias': no_decay, 'na_bias': no_decay, 'ah_bias': no_decay,
    'aw_bias': no_decay, 'ha_bias': no_decay, 'wa_bias': no_decay}))
# the 1x schedule (12 epochs, lr steps at 8 and 11), as the official config
train_cfg = dict(max_epochs=12)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1)
]
