"""What the warm start's stage 1 costs against supervised training of the same classifier, per step
(``tools/analysis/warm_start_grid.py --cost``; ``make gpu-check`` times it on a GPU)."""
import os.path as osp
import time

import torch


def step_cost(transfer_config: str, batch: int = 8, steps: int = 3, device: str = 'cpu',
              size: int = 224, recipe: str = None) -> dict:
    """Seconds per training step of stage 1 (``transfer_config``'s AttentionTransfer: the teacher's forward, the
    student's forward and backward, AdamW on what trains) against a supervised step of the kernel's classifier (its
    ``cls_*`` config: forward, loss, backward of everything, AdamW), alternating in one process on the same images;
    random weights (the release is not needed to time it). ``recipe``: time stage 1 as that recipe trains it (its
    loss and what trains; the learning rates do not change a step's cost), the config's own recipe when None.
    Returns dict(recipe, transfer_s, classifier_s, ratio, ...)."""
    from ..engine.config_checks import read_config
    from mmengine.registry import DefaultScope

    from softfree_mm.engine.device import _replace_syncbn
    cfg = read_config(transfer_config)
    name = osp.splitext(osp.basename(transfer_config))[0].replace('transfer_', 'cls_', 1)
    cls_cfg = read_config(osp.join(osp.dirname(transfer_config), name + '.py'))
    for c in (cfg, cls_cfg):
        _replace_syncbn(c.model)
    cfg.model.teacher.pop('init_cfg', None)
    if recipe is not None:
        from softfree_mm.engine.warm_start import RECIPES
        if recipe not in RECIPES:
            raise ValueError(f'recipe {recipe!r}: known recipes are {", ".join(RECIPES)}')
        cfg.model.loss, cfg.model.train = RECIPES[recipe].loss, list(RECIPES[recipe].groups)
    recipe = recipe or (cfg.get('warm_start') or {}).get('recipe', '')
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        import mmpretrain.models  # noqa: F401  (the classifier's registry)
        from mmpretrain.registry import MODELS
        from mmpretrain.structures import DataSample
        transfer = MODELS.build(cfg.model).to(device).train()
        classifier = MODELS.build(cls_cfg.model).to(device).train()
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4) for m in (transfer, classifier)]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=g).to(device)
    labels = torch.randint(0, 1000, (batch, ), generator=g)
    samples = [DataSample().set_gt_label(int(i)).to(device) for i in labels]  # beside the logits

    def step(model, opt, loss_fn):
        opt.zero_grad(set_to_none=True)
        losses = loss_fn()
        sum(v for k, v in losses.items() if k.startswith('loss')).backward()
        opt.step()

    runs = {'transfer': (transfer, opts[0], lambda: transfer(x, mode='loss')),
            'classifier': (classifier, opts[1], lambda: classifier(x, samples, mode='loss'))}
    times = {k: [] for k in runs}
    for i in range(steps + 1):  # the first round warms up
        for k, (model, opt, fn) in runs.items():
            if device == 'cuda':
                torch.cuda.synchronize()
            t = time.perf_counter()
            step(model, opt, fn)
            if device == 'cuda':
                torch.cuda.synchronize()
            if i:
                times[k].append(time.perf_counter() - t)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    trained = sum(p.numel() for p in transfer.parameters() if p.requires_grad)
    return dict(config=osp.basename(transfer_config), recipe=recipe, device=device, batch=batch, size=size, steps=steps,
                transfer_s=med['transfer'], classifier_s=med['classifier'], ratio=med['transfer'] / med['classifier'],
                trained_params=trained, student_params=sum(p.numel() for p in transfer.backbone.parameters()),
                threads=torch.get_num_threads())
