"""The Agent Attention releases (LeapLabTHU/Agent-Attention) load and compute as their official code does.

For Agent-Swin, Agent-PVT and Agent-CSWin a state dict in the official key layout and shapes (random values, small
widths and depths that keep the layout) goes through the converter, loads strictly, and our outputs equal a
reference written here from the official computation (float64, eval) to 1e-6: the classification models at 224,
the detection / segmentation backbones (mmdet 2.x / mmseg 0.x: ``backbone.`` keys, per-output norms for Swin) at
another size with their ``downstream_agent_shapes``. The whole Mask R-CNN / UperNet / Semantic FPN files convert
into our mmdet 3 / mmseg 1 models (tests/test_agent_configs.py)."""
import math

import pytest
import torch
import torch.nn.functional as F

import softfree_mm  # noqa: F401
from softfree_mm.models.backbones import SoftFreeCSWin, SoftFreePVT, SoftFreeSwin
from softfree_mm.models.converters import detect_family, unwrap_state_dict

from tests.models import test_official_weights as ow
from tests.models.test_official_weights import F64, TOL, image, lin, ln, load_strict, make_state, mlp

AGENTS = (9, 16, 49, 49)  # the releases' agent counts per stage
GRIDS = (56, 28, 14, 7)  # the grids the biases were trained at (224 input)


def agent_shapes(pre, c, heads, agents, grid, dwc=True):
    """The official AgentAttention's own tensors (its qkv / q, kv, proj are the layout's)."""
    shapes = {f'{pre}.an_bias': (heads, agents, 7, 7), f'{pre}.na_bias': (heads, agents, 7, 7),
              f'{pre}.ah_bias': (1, heads, agents, grid, 1), f'{pre}.aw_bias': (1, heads, agents, 1, grid),
              f'{pre}.ha_bias': (1, heads, grid, 1, agents), f'{pre}.wa_bias': (1, heads, 1, grid, agents)}
    if dwc:
        shapes.update({f'{pre}.dwc.weight': (c, 1, 3, 3), f'{pre}.dwc.bias': (c,)})
    return shapes


def official_agent(q, k, v, sd, pre, heads, hw, shape=None, dwc=True):
    """The official AgentAttention core on (b, n, c) q, k, v (before the projection), in the detection /
    segmentation backbones' form: agents pooled from all heads' queries at once; every bias term resized to the grid
    and then along its p x p agent axis to the agent grid (at the trained grid and p x p agents both resizes are the
    identity: the classification form); scale on the agents and the queries; the dwc on v as an image."""
    b, n, c = q.shape
    d, (hh, ww) = c // heads, hw
    num = sd[pre + '.an_bias'].shape[1]
    p = math.isqrt(num)
    shape = (p, p) if shape is None else shape
    na = shape[0] * shape[1]
    agents = F.adaptive_avg_pool2d(q.reshape(b, hh, ww, c).permute(0, 3, 1, 2), shape).reshape(b, c, na)
    agents = agents.permute(0, 2, 1).reshape(b, na, heads, d).permute(0, 2, 1, 3)
    q, k, v = (t.reshape(b, n, heads, d).permute(0, 2, 1, 3) for t in (q, k, v))

    def rule(t):  # (heads, num, H0, W0) -> (heads, n tokens, na agents)
        t = F.interpolate(t, size=hw, mode='bilinear').reshape(heads, p, p, n).permute(0, 3, 1, 2)
        return F.interpolate(t, size=shape, mode='bilinear').reshape(heads, n, na)

    pos = (rule(sd[pre + '.an_bias']) + rule((sd[pre + '.ah_bias'] + sd[pre + '.aw_bias']).squeeze(0)))
    agb = rule(sd[pre + '.na_bias']) + rule(
        (sd[pre + '.ha_bias'] + sd[pre + '.wa_bias']).squeeze(0).permute(0, 3, 1, 2))
    agent_v = torch.softmax((agents * d ** -0.5) @ k.transpose(-2, -1) + pos.transpose(1, 2), -1) @ v
    out = torch.softmax((q * d ** -0.5) @ agents.transpose(-2, -1) + agb, -1) @ agent_v
    out = out.transpose(1, 2).reshape(b, n, c)
    if dwc:
        v_img = v.transpose(1, 2).reshape(b, hh, ww, c).permute(0, 3, 1, 2)
        conv = F.conv2d(v_img, sd[pre + '.dwc.weight'], sd[pre + '.dwc.bias'], padding=1, groups=c)
        out = out + conv.flatten(2).transpose(1, 2)
    return out


# ---------------------------------------------------------------------------------------------- Agent-Swin
SWIN = dict(embed_dims=16, depths=(1, 1, 2, 2), num_heads=(1, 2, 2, 4))


def agent_swin_layout(attn_types, detection=False, dim=16, depths=SWIN['depths'], heads=SWIN['num_heads']):
    """Official AgentSwinTransformer names and shapes ('A' agent blocks, 'B' window-7 softmax blocks): the
    classifier's final ``norm`` and ``head``, or the detection backbone's per-output ``norm0..3``."""
    shapes = {'patch_embed.proj.weight': (dim, 3, 4, 4), 'patch_embed.proj.bias': (dim,),
              'patch_embed.norm.weight': (dim,), 'patch_embed.norm.bias': (dim,)}
    c = dim
    for i, depth in enumerate(depths):
        for j in range(depth):
            pre = f'layers.{i}.blocks.{j}'
            shapes.update({f'{pre}.norm1.weight': (c,), f'{pre}.norm1.bias': (c,), f'{pre}.attn.qkv.weight': (3 * c, c),
                           f'{pre}.attn.qkv.bias': (3 * c,), f'{pre}.attn.proj.weight': (c, c),
                           f'{pre}.attn.proj.bias': (c,), f'{pre}.norm2.weight': (c,), f'{pre}.norm2.bias': (c,),
                           f'{pre}.mlp.fc1.weight': (4 * c, c), f'{pre}.mlp.fc1.bias': (4 * c,),
                           f'{pre}.mlp.fc2.weight': (c, 4 * c), f'{pre}.mlp.fc2.bias': (c,)})
            if attn_types[i] == 'A':
                shapes.update(agent_shapes(f'{pre}.attn', c, heads[i], AGENTS[i], GRIDS[i]))
            else:
                shapes[f'{pre}.attn.relative_position_bias_table'] = (13 * 13, heads[i])
        if detection:
            shapes.update({f'norm{i}.weight': (c,), f'norm{i}.bias': (c,)})
        if i < len(depths) - 1:
            shapes.update({f'layers.{i}.downsample.norm.weight': (4 * c,), f'layers.{i}.downsample.norm.bias': (4 * c,),
                           f'layers.{i}.downsample.reduction.weight': (2 * c, 4 * c)})
            c *= 2
    if not detection:
        shapes.update({'norm.weight': (c,), 'norm.bias': (c,), 'head.weight': (10, c), 'head.bias': (10,)})
    sd = make_state(shapes)
    for i, depth in enumerate(depths):
        for j in range(depth):
            if attn_types[i] == 'B':
                sd[f'layers.{i}.blocks.{j}.attn.relative_position_index'] = ow._rel_index(7)
    return sd


def official_agent_swin(sd, img, attn_types, heads=SWIN['num_heads'], shapes=None, detection=False):
    """The official forward: agent stages over the whole grid (no shift), 'B' stages in shifted 7x7 windows (the
    classifier clamps the window to a 7x7 grid and drops its shift, the detection backbone does not)."""
    x = F.conv2d(img, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'], stride=4)
    h, w = x.shape[2:]
    x = ln(x.flatten(2).transpose(1, 2), sd, 'patch_embed.norm')
    outs = []
    for i, kind in enumerate(attn_types):
        j = 0
        while f'layers.{i}.blocks.{j}.norm1.weight' in sd:
            pre = f'layers.{i}.blocks.{j}'
            xn = ln(x, sd, pre + '.norm1')
            if kind == 'A':
                q, k, v = lin(xn, sd, pre + '.attn.qkv').reshape(1, h * w, 3, -1).unbind(2)
                y = official_agent(q, k, v, sd, pre + '.attn', heads[i], (h, w), shapes[i] if shapes else None)
                y = lin(y, sd, pre + '.attn.proj')
            else:
                window, shift = 7, (0 if j % 2 == 0 else 3)
                if not detection and min(h, w) <= window:
                    window, shift = min(h, w), 0
                y = ow._swin_window_attention(xn.view(1, h, w, -1), sd, pre + '.attn', heads[i], window,
                                              shift).reshape(1, h * w, -1)
            x = x + y
            x = x + mlp(ln(x, sd, pre + '.norm2'), sd, pre + '.mlp')
            j += 1
        if detection:
            outs.append(ln(x, sd, f'norm{i}').transpose(1, 2).reshape(1, -1, h, w))
        if i < len(attn_types) - 1:
            g = F.pad(x.view(1, h, w, -1), (0, 0, 0, w % 2, 0, h % 2))  # (the official merge pads odd sides)
            h, w = g.shape[1:3]
            g = torch.cat([g[:, 0::2, 0::2], g[:, 1::2, 0::2], g[:, 0::2, 1::2], g[:, 1::2, 1::2]], -1)
            h, w = h // 2, w // 2
            x = lin(ln(g.view(1, h * w, -1), sd, f'layers.{i}.downsample.norm'), sd, f'layers.{i}.downsample.reduction')
    return outs if detection else [ln(x, sd, 'norm').transpose(1, 2).reshape(1, -1, h, w)]


@pytest.mark.parametrize('arch,attn_types', [('agent_tiny', 'AAAB'), ('agent_small', 'AABB')])
def test_agent_swin_release_layout_loads_strictly_and_equals_the_official_computation(arch, attn_types):
    official = agent_swin_layout(attn_types)
    model = SoftFreeSwin(arch=arch, drop_path_rate=0., out_indices=(3,), **SWIN)
    load_strict(model, official, 'agent_swin')
    with torch.no_grad():
        x = image(224, 224)
        torch.testing.assert_close(model(x)[0], official_agent_swin(official, x, attn_types)[0], **TOL)


# 448: every stage's grid a multiple of 7 above 7 (every padding rule agrees); 256x320: stage 4's 8x10 grid padded to
# 14x14; 224x320: stage 4's 7x10 grid one window high (the official code shifts it all the same) and padded
@pytest.mark.parametrize('hw', [(448, 448), (256, 320), (224, 320)], ids=['448', '256x320', '224x320'])
def test_agent_swin_detection_backbone_with_more_agents_equals_the_official_detection_computation(hw):
    """The Mask R-CNN / UperNet backbone (agents 9-12-14 in place of 9-16-49, biases resized) computes the official
    detection code's function at sizes that pad: its preset carries that code's window rule (zero pad tokens
    attended as keys, shifted blocks rolled along both axes whatever the grid), to 1e-10 in float64."""
    official = {'backbone.' + k: v for k, v in agent_swin_layout('AAAB', detection=True).items()}
    model = SoftFreeSwin(arch='agent_tiny_downstream', drop_path_rate=0., **SWIN)
    family, converted = detect_family(unwrap_state_dict({'state_dict': official}))
    assert family == 'agent_swin'
    load_strict(model, converted, family)
    sd = {k[len('backbone.'):]: v for k, v in official.items()}
    with torch.no_grad():
        x = image(*hw)
        ref = official_agent_swin(sd, x, 'AAAB', shapes=((9, 9), (12, 12), (14, 14), (7, 7)), detection=True)
        for ours, theirs in zip(model(x), ref):
            torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------- Agent-PVT
PVT = dict(embed_dims=(16, 32, 40, 64), num_heads=(1, 2, 5, 8), depths=(1, 1, 1, 1))


def agent_pvt_layout():
    """Official PyramidVisionTransformer (agent_pvt.py) names and shapes: 'AAAA', agent_sr_ratios 1111."""
    shapes, cin = {}, 3
    for i, (c, heads) in enumerate(zip(PVT['embed_dims'], PVT['num_heads']), start=1):
        p, side, hid = (4 if i == 1 else 2), GRIDS[i - 1], c * (8, 8, 4, 4)[i - 1]
        shapes.update({f'patch_embed{i}.proj.weight': (c, cin, p, p), f'patch_embed{i}.proj.bias': (c,),
                       f'patch_embed{i}.norm.weight': (c,), f'patch_embed{i}.norm.bias': (c,),
                       f'pos_embed{i}': (1, side * side, c)})
        pre = f'block{i}.0'
        shapes.update({f'{pre}.norm1.weight': (c,), f'{pre}.norm1.bias': (c,), f'{pre}.attn.q.weight': (c, c),
                       f'{pre}.attn.q.bias': (c,), f'{pre}.attn.kv.weight': (2 * c, c), f'{pre}.attn.kv.bias': (2 * c,),
                       f'{pre}.attn.proj.weight': (c, c), f'{pre}.attn.proj.bias': (c,), f'{pre}.norm2.weight': (c,),
                       f'{pre}.norm2.bias': (c,), f'{pre}.mlp.fc1.weight': (hid, c), f'{pre}.mlp.fc1.bias': (hid,),
                       f'{pre}.mlp.fc2.weight': (c, hid), f'{pre}.mlp.fc2.bias': (c,),
                       **agent_shapes(f'{pre}.attn', c, heads, AGENTS[i - 1], side)})
        cin = c
    shapes.update({'head.weight': (10, cin), 'head.bias': (10,)})
    return make_state(shapes)


def official_agent_pvt(sd, img, shapes=None):
    """The four stage maps of the official forward (classification: forward_features then averages stage 4;
    detection: returns them); positions resized as the official _get_pos_embed does (it compares with stage 1)."""
    x, outs = img, []
    for i in range(1, 5):
        p = 4 if i == 1 else 2
        x = F.conv2d(x, sd[f'patch_embed{i}.proj.weight'], sd[f'patch_embed{i}.proj.bias'], stride=p)
        h, w = x.shape[2:]
        x = ln(x.flatten(2).transpose(1, 2), sd, f'patch_embed{i}.norm')
        pos, side = sd[f'pos_embed{i}'], GRIDS[i - 1]
        if h * w != 56 * 56:
            pos = F.interpolate(pos.reshape(1, side, side, -1).permute(0, 3, 1, 2), size=(h, w),
                                mode='bilinear').reshape(1, -1, h * w).permute(0, 2, 1)
        x = x + pos
        pre = f'block{i}.0'
        xn = ln(x, sd, pre + '.norm1', 1e-6)
        k, v = lin(xn, sd, pre + '.attn.kv').reshape(1, h * w, 2, -1).unbind(2)
        y = official_agent(lin(xn, sd, pre + '.attn.q'), k, v, sd, pre + '.attn', PVT['num_heads'][i - 1], (h, w),
                           shapes[i - 1] if shapes else None)
        x = x + lin(y, sd, pre + '.attn.proj')
        x = x + mlp(ln(x, sd, pre + '.norm2', 1e-6), sd, pre + '.mlp')
        x = x.reshape(1, h, w, -1).permute(0, 3, 1, 2)
        outs.append(x)
    return outs


DOWN_SHAPES = ((12, 12), (16, 16), (28, 28), (28, 28))


@pytest.mark.parametrize('arch,hw,shapes', [
    ('agent_small', (224, 224), None),  # the classifier at its size
    ('agent_small_downstream', (160, 256), DOWN_SHAPES),  # Mask R-CNN / Semantic FPN
    # Semantic FPN at a width that is no multiple of 32 (ADE20K's test images are not padded to 32): the official
    # strided patch convs round every grid down (64x85, 32x42, 16x21, 8x10)
    ('agent_small_downstream', (256, 342), DOWN_SHAPES),
])
def test_agent_pvt_release_layout_loads_strictly_and_equals_the_official_computation(arch, hw, shapes):
    official = agent_pvt_layout()
    model = SoftFreePVT(arch=arch, drop_path_rate=0., **PVT)
    load_strict(model, official, 'agent_pvt')
    with torch.no_grad():
        x = image(*hw)
        for ours, theirs in zip(model(x), official_agent_pvt(official, x, shapes)):
            assert ours.shape == theirs.shape
            torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------- Agent-CSWin
CSWIN = dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=(2, 2, 4, 4))


def test_agent_cswin_release_layout_loads_strictly_and_equals_the_official_computation(monkeypatch):
    """'AABB': stages 1-2 one agent branch over the whole grid (la_split 56-28) with the LePE conv get_v (our lepe:
    the kernel has no dwc of its own), stages 3-4 the softmax stripes."""
    kinds = ('I', 'I', 'S', 'S')  # the InLine-CSwin layout's branch structure; 'I' blocks hold agent tensors here
    layout = ow.cswin_layout(kinds, dim=16, depths=CSWIN['depths'], heads=CSWIN['num_heads'])
    official = {k: v for k, v in layout.items() if '.residual.' not in k}
    shapes = {}
    for s, c in ((1, 16), (2, 32)):
        shapes.update(agent_shapes(f'stage{s}.0.attns.0', c, CSWIN['num_heads'][s - 1], AGENTS[s - 1], GRIDS[s - 1],
                                   dwc=False))
    official.update(make_state(shapes, seed=3))
    model = SoftFreeCSWin(arch='agent_tiny', drop_path_rate=0., out_indices=(3,), **CSWIN)
    load_strict(model, official, 'agent_cswin')

    def agent_branch(q, k, v, sd, pre, heads, hw, x_mean):
        b, h, w, c = q.shape
        lepe = F.conv2d(v.permute(0, 3, 1, 2), sd[pre + '.get_v.weight'], sd[pre + '.get_v.bias'], padding=1,
                        groups=c)
        out = official_agent(*(t.reshape(b, h * w, c) for t in (q, k, v)), sd, pre, heads, hw, dwc=False)
        return (out + lepe.flatten(2).transpose(1, 2)).view(b, h, w, c)

    monkeypatch.setattr(ow, '_cswin_inline_branch', agent_branch)
    with torch.no_grad():
        x = image(224, 224)
        torch.testing.assert_close(model(x)[0], ow.official_cswin(official, x, kinds, CSWIN['num_heads'])[0], **TOL)


def test_each_agent_release_is_detected_as_its_family():
    for layout, family in ((agent_swin_layout('AAAB'), 'agent_swin'), (agent_pvt_layout(), 'agent_pvt')):
        assert detect_family(layout)[0] == family
    assert F64 == torch.float64
