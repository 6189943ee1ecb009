"""softfree_mm.models.transfer.AttentionTransfer: the warm start's stage 1, block by block.

Guards: with softmax in the student (the teacher's own kernel, the same weights) every block's loss is exactly zero,
in every family; with another kernel it is not, and a few optimiser steps lower it on a tiny model; each block's loss
equals the formula computed here from the teacher's and the student's blocks run by hand (the teacher's input fed
to the student's block, the error over the teacher block's own update); only the chosen groups and what the teacher
has no value for get gradients, and frozen parameters are bit-identical after the steps; the checkpoint holds the
student as ``backbone.*`` and no teacher; a student of another family, depth or width is refused at build.
"""
import pytest
import torch

import softfree_mm  # noqa: F401  (registers the backbones)
from softfree_mm.models.transfer import AttentionTransfer, blocks_of, parameter_groups

from tests.helpers.models import build_in
from tests.helpers.presets import TINY

FAMILIES = ('SoftFreeXCiT', 'SoftFreePVT', 'SoftFreePVTv2', 'SoftFreeSwin', 'SoftFreeCSWin', 'SoftFreeSOFT')
# a kernel with parameters of its own in each layout that takes it (XCA's channel attention takes none)
OWN = {'SoftFreePVTv2': dict(attn_cfg='inline', sr_ratios=(1, 1, 1, 1)),
       'SoftFreeSwin': dict(attn_cfg='soft', global_window=True),
       'SoftFreeCSWin': dict(attn_cfg='inline', global_window=True),
       'SoftFreeSOFT': dict(attn_cfg=['soft', 'soft', 'soft', 'softmax'])}
# linear in the first stage (XCiT: the first of its four tiny layers), the teacher's softmax everywhere else
MIXED = ['linear', 'softmax', 'softmax', 'softmax']


@pytest.fixture(scope='module')
def releases(tmp_path_factory):
    """A softmax 'release' of each tiny family: random weights saved as a file the teacher loads."""
    folder = tmp_path_factory.mktemp('releases')
    out = {}
    for fam in FAMILIES:
        torch.manual_seed(1)
        model = build_in('softfree_mm', dict(type=fam, **TINY[fam], attn_cfg='softmax'))
        out[fam] = str(folder / f'{fam}.pth')
        torch.save({'state_dict': model.state_dict()}, out[fam])
    return out


def _transfer(fam, release, student=None, train=('kernel', 'qkv')):
    base = dict(type=fam, **TINY[fam])
    model = build_in('softfree_mm', dict(type='AttentionTransfer', backbone=dict(base, **(student or {})),
                              teacher=dict(base, attn_cfg='softmax',
                                           init_cfg=dict(type='Pretrained', checkpoint=release)), train=train))
    model.init_weights()
    return model.train()


def _images(seed=0):
    return torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(seed))


def _kernel_name(block):
    from softfree_mm.attention import AttentionKernel
    return next(type(m).__name__ for m in block.modules() if isinstance(m, AttentionKernel))


@pytest.mark.parametrize('fam', FAMILIES)
def test_blocks_with_the_teachers_kernel_have_zero_loss_and_are_left_out_of_the_loss_and_the_optimiser(fam, releases):
    """The SOFT family (post-norm blocks) as the others: a block with the teacher's kernel in the teacher's layout has
    exactly zero loss (computed on request), is left out of the mean and not run by default, gets no gradient and no
    optimiser state; the other blocks' loss is not zero. A student that is the teacher throughout is refused."""
    from mmengine.optim import build_optim_wrapper
    with pytest.raises(ValueError, match="nothing to transfer: every block of the student computes what the "
                                         "teacher's does"):
        _transfer(fam, releases[fam], dict(attn_cfg='softmax'))
    model = _transfer(fam, releases[fam], dict(attn_cfg=MIXED))
    blocks = blocks_of(model.backbone)
    softmax = {i for i, (_, b) in enumerate(blocks) if _kernel_name(b) == 'SoftmaxAttention'}
    assert model.same == softmax and 0 < len(softmax) < len(blocks)
    every = model.transfer_losses(_images(), every_block=True)
    for i in range(len(blocks)):
        value = float(every[f'block_{i:02d}'])
        assert (value == 0.0) if i in softmax else (value > 0), (i, value)
    losses = model(_images(), mode='loss')
    assert sorted(k for k in losses if k.startswith('block_')) == [f'block_{i:02d}' for i in range(len(blocks))
                                                                   if i not in softmax]
    torch.testing.assert_close(losses['loss_transfer'], every['loss_transfer'])
    frozen = tuple(f'{blocks[i][0]}.' for i in softmax)
    assert not [n for n in model.trained if n.startswith(frozen)]
    wrapper = build_optim_wrapper(model, dict(optimizer=dict(type='AdamW', lr=1e-3)))  # every parameter in a group
    model(_images(), mode='loss')['loss_transfer'].backward()
    wrapper.step()
    params = dict(model.backbone.named_parameters())
    stepped = {n for n, p in params.items() if p in wrapper.optimizer.state}
    assert stepped and not [n for n in stepped if n.startswith(frozen)]
    assert all(params[n].grad is None for n in params if n.startswith(frozen))


@pytest.mark.parametrize('fam', FAMILIES)
def test_each_blocks_loss_is_the_teacher_fed_error_over_the_teachers_update(fam, releases):
    """The formula by hand: the teacher's blocks run in order from its own stem; block l of the student gets the
    teacher's input of block l (and, for the layout arguments, what the student's own stage gives it)."""
    model = _transfer(fam, releases[fam], OWN.get(fam, dict(attn_cfg='poly')))
    x = _images(3)
    losses = model(x, mode='loss')
    seen_t, seen_s = [], []
    for net, seen in ((model.teacher, seen_t), (model.backbone, seen_s)):
        hooks = [b.register_forward_pre_hook(lambda m, a, k, s=seen, b=b: s.append((b, a, k)), with_kwargs=True)
                 for _, b in blocks_of(net)]
        with torch.no_grad():
            net(x)
        for h in hooks:
            h.remove()
    with torch.no_grad():
        for i, ((tb, targs, tkw), (sb, sargs, skw)) in enumerate(zip(seen_t, seen_s)):
            if i in model.same:  # the teacher's own block: not in the loss
                assert f'block_{i:02d}' not in losses
                continue
            target = tb(*targs, **tkw)
            out = sb(targs[0], *sargs[1:], **skw)
            x = targs[0]
            # what the block adds to its stream: over x (pre-norm), over its norms of x (SOFT's post-norm blocks)
            base = tb.norm2(tb.norm1(x)) if type(tb).__name__ == 'SoftBlock' else x
            expected = (out - target).pow(2).mean() / (target - base).pow(2).mean()
            torch.testing.assert_close(losses[f'block_{i:02d}'], expected, rtol=1e-5, atol=1e-7)
    assert float(losses['loss_transfer']) == pytest.approx(
        float(torch.stack([losses[f'block_{i:02d}'] for i in range(len(seen_t)) if i not in model.same]).mean()),
        rel=1e-6)


@pytest.mark.parametrize('fam', FAMILIES)
def test_steps_lower_the_loss_and_touch_only_what_trains(fam, releases):
    torch.manual_seed(0)  # the student's new parameters: not whatever draw the suite's order leaves
    model = _transfer(fam, releases[fam], OWN.get(fam, dict(attn_cfg='poly')))
    before = {k: v.clone() for k, v in model.state_dict(keep_vars=False).items()}
    teacher_before = {k: v.clone() for k, v in model.teacher.state_dict().items()}
    trained = set(model.trained)
    assert trained, 'nothing trains'
    params = dict(model.backbone.named_parameters())
    assert {n for n, p in params.items() if p.requires_grad} == trained
    assert not any(p.requires_grad for p in model.teacher.parameters())
    # what the teacher has no value for (the kernel's own, a new layout's) trains in any case
    assert set(n for n in model.new if n in params) <= trained
    # lr 3e-3: at 1e-2 the x^3 student of the tiny PVT (reduced keys) climbs instead (0.178 -> 0.229 in 25 steps,
    # whatever the seed, on this machine's torch 2.14.1); every family falls at 3e-3 and at 1e-3
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.05)
    x = _images(5)
    first = float(model(x, mode='loss')['loss_transfer'])
    for _ in range(25):
        opt.zero_grad()
        loss = model(x, mode='loss')['loss_transfer']
        loss.backward()
        assert all((p.grad is not None) == (n in trained) for n, p in params.items())
        opt.step()
    last = float(model(x, mode='loss')['loss_transfer'])
    assert last < 0.9 * first, (first, last)
    after = model.state_dict()
    assert not any(k.startswith('teacher.') for k in after)  # the teacher is the release file, not the checkpoint
    changed = {k[len('backbone.'):] for k, v in after.items() if not torch.equal(v, before[k])}
    assert changed <= trained, sorted(changed - trained)  # frozen: bit-identical
    assert len(changed) >= 0.8 * len(trained)
    assert all(torch.equal(v, teacher_before[k]) for k, v in model.teacher.state_dict().items())


def test_groups_name_the_kernel_the_input_projections_and_the_output_projection():
    swin = build_in('softfree_mm', dict(type='SoftFreeSwin', **TINY['SoftFreeSwin'], attn_cfg='inline',
                                       global_window=True))
    _, block = blocks_of(swin)[0]
    groups = parameter_groups(block)
    assert groups['kernel'] and all('.kernel.' in n for n in groups['kernel'])
    assert set(groups['qkv']) == {'attn.qkv.weight', 'attn.qkv.bias'}
    assert set(groups['proj']) == {'attn.proj.weight', 'attn.proj.bias'}
    assert set(groups['blocks']) == {n for n, _ in block.named_parameters()}
    xcit = build_in('softfree_mm', dict(type='SoftFreeXCiT', **TINY['SoftFreeXCiT'], attn_cfg='poly'))
    _, block = blocks_of(xcit)[0]
    assert 'attn.temperature' in parameter_groups(block)['qkv']  # held by the attention layer itself


@pytest.mark.parametrize('student, message', [
    (dict(type='SoftFreePVTv2'), 'the student backbone is a SoftFreePVTv2, the teacher a SoftFreeSwin'),
    (dict(arch=dict(embed_dims=16, depths=(2, 2, 2, 1), num_heads=(1, 2, 2, 4))), 'attention blocks'),
    (dict(arch=dict(embed_dims=24, depths=(2, 2, 1, 1), num_heads=(1, 2, 2, 4))), 'another architecture'),
    (dict(arch=dict(embed_dims=16, depths=(2, 2, 1, 1), num_heads=(2, 2, 2, 4))), 'another architecture'),
])
def test_a_student_that_is_not_the_teachers_twin_is_refused_at_build(student, message, releases):
    base = dict(type='SoftFreeSwin', **TINY['SoftFreeSwin'])
    if student.get('type') == 'SoftFreePVTv2':
        student = dict(TINY['SoftFreePVTv2'], **student)
    with pytest.raises(ValueError, match=message):
        AttentionTransfer(backbone=dict(base, **student, attn_cfg='poly'),
                          teacher=dict(base, attn_cfg='softmax', init_cfg=dict(type='Pretrained',
                                                                             checkpoint=releases['SoftFreeSwin'])))


def _kernels_with_parameters():
    from softfree_mm.attention import build_attention, list_attentions
    return [n for n in list_attentions() if any(True for _ in build_attention(dict(type=n), num_heads=2,
                                                                               head_dim=8).parameters())]


def _fitting_student(kernel):
    """(family, student arguments) of the first family whose tiny preset takes ``kernel``, in its own layout or in
    its declared fit (global windows, no spatial reduction)."""
    from softfree_mm.models.family import FAMILIES as DECLARED
    for fam in FAMILIES:
        fit = DECLARED[fam].family.fit
        for extra in ({}, *([fit[1]] if fit else [])):
            student = dict(attn_cfg=kernel, **extra)
            try:
                build_in('softfree_mm', dict(type=fam, **TINY[fam], **student))
            except (ValueError, TypeError):
                continue
            return fam, student
    raise AssertionError(f'no family takes {kernel}')



@pytest.mark.parametrize('kernel', _kernels_with_parameters())
def test_train_kernel_alone_trains_exactly_the_kernels_own_parameters(kernel, releases):
    """train=('kernel',): the parameters inside the student's kernels train, and what the teacher has no value for
    (which they are part of); no input or output projection, nothing else."""
    from softfree_mm.attention import AttentionKernel
    fam, student = _fitting_student(kernel)
    model = _transfer(fam, releases[fam], student, train=('kernel', ))
    own = {f'{name}.{p}' for name, m in model.backbone.named_modules() if isinstance(m, AttentionKernel)
           for p, _ in m.named_parameters()}
    params = dict(model.backbone.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    assert own and own <= trainable
    assert trainable == own | {n for n in model.new if n in params}, sorted(trainable - own)
    projections = {f'{path}.{n}' for path, block in blocks_of(model.backbone)
                   for g in ('qkv', 'proj') for n in parameter_groups(block)[g]}
    assert not (trainable & projections - set(model.new)), sorted(trainable & projections)


def test_a_transfer_that_would_train_nothing_is_refused(releases):
    with pytest.raises(ValueError, match=r"nothing would train: the student's kernels have no parameters of their own "
                                         r"and train=\['kernel'\] selects none"):
        _transfer('SoftFreeSwin', releases['SoftFreeSwin'], dict(attn_cfg='poly'), train=('kernel', ))


def test_bad_groups_are_refused():
    base = dict(type='SoftFreeSwin', **TINY['SoftFreeSwin'])
    with pytest.raises(ValueError, match=r"train must name groups of \['kernel', 'qkv', 'proj', 'blocks'\], got "
                                         r"\['mlp'\]"):
        AttentionTransfer(backbone=dict(base, attn_cfg='poly'), teacher=dict(base, attn_cfg='softmax'), train='mlp')


def test_a_block_that_never_runs_in_the_teachers_forward_is_one_error_naming_it_and_the_family(releases):
    """XCiT's feature-map mode stops after out_indices[-1]: the blocks after it never run."""
    base = dict(type='SoftFreeXCiT', **dict(TINY['SoftFreeXCiT'], depth=6, out_indices=(0, 1, 2, 3)))
    with pytest.raises(ValueError, match=r"^AttentionTransfer: block blocks\.4 of SoftFreeXCiT never runs in the "
                                         r"teacher's forward"):
        AttentionTransfer(backbone=dict(base, attn_cfg='poly'), teacher=dict(base, attn_cfg='softmax'))


def test_a_block_that_returns_a_tuple_is_one_error_naming_it_and_the_family():
    """A family whose blocks return (tokens, extra) breaks the contract: refused at build, naming the block."""
    from mmengine.registry import MODELS as ROOT_MODELS

    from softfree_mm.models.backbones.pvt import SoftFreePVTv2

    class TupleBlocksPVTv2(SoftFreePVTv2):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            for _, block in blocks_of(self):
                block.forward = (lambda f: lambda *a, **k: (f(*a, **k), None))(block.forward)

    registry = ROOT_MODELS._search_child('softfree_mm')
    registry.register_module(module=TupleBlocksPVTv2, force=True)
    try:
        base = dict(type='TupleBlocksPVTv2', **TINY['SoftFreePVTv2'])
        with pytest.raises(ValueError, match=r'^AttentionTransfer: block stages\.0\.blocks\.0 of TupleBlocksPVTv2 '
                                             r'returns a tuple of 2, not one tensor shaped as its input'):
            AttentionTransfer(backbone=dict(base, attn_cfg='poly'), teacher=dict(base, attn_cfg='softmax'))
    finally:
        registry._module_dict.pop('TupleBlocksPVTv2', None)


@pytest.mark.parametrize('fam', ['SoftFreeSwin', 'SoftFreePVTv2'])  # checkpointing inside the block / around it
@pytest.mark.parametrize('with_cp', [False, True])
def test_with_cp_checkpoints_the_student_blocks_in_stage_1_with_the_same_loss_and_gradients(with_cp, fam, releases):
    """The student stays in eval mode; with_cp still recomputes each block in the backward pass (its attention kernel
    runs twice), with the loss and gradients of the run without it."""
    from softfree_mm.attention import AttentionKernel
    model = _transfer(fam, releases[fam], dict(attn_cfg='poly', with_cp=with_cp))
    calls = []
    handles = [k.register_forward_hook(lambda *a: calls.append(1)) for k in model.backbone.modules()
               if isinstance(k, AttentionKernel)]
    loss = model(_images(), mode='loss')['loss_transfer']
    before = len(calls)
    loss.backward()
    for h in handles:
        h.remove()
    assert before > 0 and len(calls) - before == (before if with_cp else 0)
    grads = {n: p.grad.clone() for n, p in model.backbone.named_parameters() if p.grad is not None}
    other = _transfer(fam, releases[fam], dict(attn_cfg='poly', with_cp=not with_cp))
    other_loss = other(_images(), mode='loss')['loss_transfer']
    other_loss.backward()
    torch.testing.assert_close(loss, other_loss)
    for n, p in other.backbone.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-5, atol=1e-7)


def _swap_kernels_for_the_teachers(model):
    """The student made the teacher: the teacher's kernels in place of its own, the teacher's weights."""
    import copy
    from softfree_mm.attention import AttentionKernel
    for (_, sb), (_, tb) in zip(blocks_of(model.backbone), blocks_of(model.teacher)):
        for (name, k), (_, tk) in zip([(n, m) for n, m in sb.named_modules() if isinstance(m, AttentionKernel)],
                                      [(n, m) for n, m in tb.named_modules() if isinstance(m, AttentionKernel)]):
            parent = sb.get_submodule(name.rpartition('.')[0]) if '.' in name else sb
            setattr(parent, name.rpartition('.')[2], copy.deepcopy(tk))
    model.backbone.load_state_dict(model.teacher.state_dict())


@pytest.mark.parametrize('fam', ['SoftFreeSwin', 'SoftFreePVTv2', 'SoftFreeXCiT'])
@pytest.mark.parametrize('loss,key', [('blocks+final', 'loss_final'), ('blocks+attn', 'loss_attn')])
def test_each_distillation_loss_is_zero_with_the_teachers_kernel_and_falls_on_a_tiny_model(fam, loss, key, releases):
    """The recipes' extra losses: zero once the student computes what the teacher does, above zero with relu(s)/N in
    the first stage (layer), and falling under a few steps of their own gradient; the attention term of a block with
    the teacher's kernel is zero (its weights computed on request)."""
    student = dict(attn_cfg=['relu', 'softmax', 'softmax', 'softmax'])
    base = dict(type=fam, **TINY[fam])
    model = build_in('softfree_mm', dict(type='AttentionTransfer', backbone=dict(base, **student), loss=loss,
                                         teacher=dict(base, attn_cfg='softmax', init_cfg=dict(
                                             type='Pretrained', checkpoint=releases[fam]))))
    model.init_weights()
    model.train()
    x = _images(7)
    if loss == 'blocks+attn':
        every = model.transfer_losses(x, every_block=True)
        assert all(float(every[f'attn_{i:02d}']) == 0.0 for i in model.same)
        assert all(float(every[f'attn_{i:02d}']) > 0 for i in range(len(blocks_of(model.backbone)))
                   if i not in model.same)
    first = float(model(x, mode='loss')[key])
    assert first > 1e-7
    before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)  # all: only what trains gets gradients
    for _ in range(30):
        opt.zero_grad()
        losses = model(x, mode='loss')
        (losses['loss_transfer'] * 0 + losses[key]).backward()
        opt.step()
    assert float(model(x, mode='loss')[key]) < 0.6 * first
    changed = {k for k, v in model.backbone.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and changed <= set(model.trained), sorted(changed - set(model.trained))  # the recipe's groups only
    _swap_kernels_for_the_teachers(model)
    assert float(model(x, mode='loss')[key]) == 0.0


def test_attention_weight_matching_is_refused_by_name_for_a_kernel_without_a_score_map(releases):
    base = dict(type='SoftFreePVTv2', **TINY['SoftFreePVTv2'])
    with pytest.raises(ValueError, match=r"loss='blocks\+attn' matches attention weights, but the kernel 'efficient' "
                                         r"of stages\.0\.blocks\.0 has none of a per-pair score map \(A = softmax "
                                         r"over channels"):
        AttentionTransfer(backbone=dict(base, attn_cfg='efficient'), loss='blocks+attn',
                          teacher=dict(base, attn_cfg='softmax'))
    with pytest.raises(ValueError, match=r"loss must be one of \['blocks', 'blocks\+final', 'blocks\+attn'\], got "
                                         r"'hedgehog'"):
        AttentionTransfer(backbone=dict(base, attn_cfg='poly'), teacher=dict(base, attn_cfg='softmax'),
                          loss='hedgehog')


def test_attention_rows_are_drawn_anew_at_each_step_and_again_on_resume():
    """transfer-attn's sampled query rows: other rows at every training step, the same ones at the same step (so a
    resumed run matches an uninterrupted one), distinct, and the global random stream untouched."""
    from mmengine.logging import MessageHub

    from softfree_mm.models.transfer import attention_rows, training_step
    torch.manual_seed(0)
    before = torch.rand(1)
    a, b, again = attention_rows(196, 64, 0), attention_rows(196, 64, 1), attention_rows(196, 64, 0)
    assert torch.equal(a, again) and not torch.equal(a, b)
    assert len(set(a.tolist())) == 64 and int(a.max()) < 196
    assert attention_rows(10, 64, 3).sort().values.tolist() == list(range(10))  # fewer rows than asked: all
    torch.manual_seed(0)
    assert torch.equal(torch.rand(1), before)
    hub = MessageHub.get_current_instance()
    was = hub.get_info('iter', 0)
    hub.update_info('iter', 7)
    try:
        assert training_step() == 7
    finally:
        hub.update_info('iter', was)


def _recipe_model(fam, release, loss, student, **kwargs):
    base = dict(type=fam, **TINY[fam])
    model = build_in('softfree_mm', dict(type='AttentionTransfer', backbone=dict(base, **student), loss=loss,
                                         teacher=dict(base, attn_cfg='softmax', init_cfg=dict(
                                             type='Pretrained', checkpoint=release)), **kwargs))
    model.init_weights()
    return model.train()


@pytest.mark.parametrize('fam', ['SoftFreePVTv2', 'SoftFreeSwin'])
def test_the_final_feature_term_is_the_relative_error_of_the_whole_student_against_the_teacher(fam, releases):
    """transfer-final's term by hand: extra_weight x the mean over the backbone's outputs of
    mean((student(x) - teacher(x))^2) / mean(teacher(x)^2), the student run end to end (no block substituted); the
    normaliser is not 1 on these models, so the term without it differs."""
    model = _recipe_model(fam, releases[fam], 'blocks+final', dict(attn_cfg=['relu', 'softmax', 'softmax', 'softmax']),
                          extra_weight=0.5)
    for net in (model.teacher, model.backbone):  # outputs of mean square ~9, not the LayerNorms' ~1
        inside = {id(m) for _, b in blocks_of(net) for m in b.modules()}
        with torch.no_grad():
            for m in net.modules():
                if isinstance(m, torch.nn.LayerNorm) and id(m) not in inside:
                    m.weight.mul_(3.0)
    x = _images(3)
    got = model.transfer_losses(x)['loss_final']
    model.clear_substitutes()
    with torch.no_grad():
        s, t = model.backbone(x), model.teacher(x)
    s, t = (s, ) if torch.is_tensor(s) else s, (t, ) if torch.is_tensor(t) else t
    terms = [(a - b).pow(2).mean() / b.pow(2).mean() for a, b in zip(s, t)]
    want = 0.5 * torch.stack(terms).mean()
    torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=0)
    unnormalised = 0.5 * torch.stack([(a - b).pow(2).mean() for a, b in zip(s, t)]).mean()
    assert abs(float(unnormalised) - float(want)) > 0.05 * float(want)


def test_the_attention_term_takes_the_sampled_rows_of_the_full_matrices_with_bias_and_masks(releases):
    """transfer-attn's term by hand on Swin's shifted, padded 7x7 windows (49 tokens a window, a relative position
    bias in teacher and student, the masks of the roll and the pads), 5 sampled rows, fewer than a window's tokens:
    for every call of a block that trains, the teacher's and the student's full attention matrices (bias and mask
    whole), the sampled rows of both, their relative squared error; the term is extra_weight x the mean over calls.
    A bias or mask that did not follow the rows would give other values."""
    from softfree_mm.attention import AttentionKernel
    from softfree_mm.models.transfer import attention_rows, training_step
    model = _recipe_model('SoftFreeSwin', releases['SoftFreeSwin'], 'blocks+attn',
                          dict(attn_cfg=['relu', 'relu', 'softmax', 'softmax']), attn_rows=5, extra_weight=2.0)
    calls = {'t': {}, 's': {}}
    handles = []
    for side, net in (('t', model.teacher), ('s', model.backbone)):
        for i, (_, block) in enumerate(blocks_of(net)):
            if i in model.same:
                continue
            for name, k in block.named_modules():
                if isinstance(k, AttentionKernel):
                    def hook(module, args, kwargs, output, key=(i, name), side=side):
                        calls[side][key] = (module, dict(zip(('q', 'k', 'v', 'hw', 'scale', 'bias', 'mask'), args),
                                                         **kwargs))
                    handles.append(k.register_forward_hook(hook, with_kwargs=True))
    try:
        got = model.transfer_losses(_images(5))['loss_attn']
    finally:
        for h in handles:
            h.remove()
    assert calls['s'] and calls['s'].keys() == calls['t'].keys()
    some = next(iter(calls['t'].values()))[1]
    assert some['bias'] is not None and some['mask'] is not None and some['q'].shape[2] == 49  # what is tested
    errors = []
    for key, (ks, ps) in calls['s'].items():
        kt, pt = calls['t'][key]
        rows = attention_rows(pt['q'].shape[2], 5, training_step())

        def full(kernel, p):
            with torch.no_grad():
                return kernel.score_map(p['q'], p['k'], hw=p.get('hw'), scale=p.get('scale'), bias=p.get('bias'),
                                        mask=p.get('mask')).matrix().float()[:, :, rows, :]
        a_s, a_t = full(ks, ps), full(kt, pt)
        errors.append((a_s - a_t).pow(2).mean() / a_t.pow(2).mean())
    torch.testing.assert_close(got.detach(), 2.0 * torch.stack(errors).mean(), rtol=1e-5, atol=0)
