"""What two or more backbones share: attention-config expansion, kernel fit checks, token-grid helpers."""
from typing import List, Sequence, Union

import torch

from ..attention import kernel_class, list_attentions, normalize_cfg

AttnCfg = Union[str, dict, None]


def expand_attn_cfg(attn_cfg: Union[AttnCfg, Sequence[AttnCfg]], num: int, unit: str, owner: str) -> List[dict]:
    """One kernel config for every unit, or a list/tuple with exactly one per unit (stage or layer).

    Returns ``num`` validated config dicts (each a fresh copy). Errors name the bad value and what is valid.
    """
    if isinstance(attn_cfg, (list, tuple)):
        if len(attn_cfg) != num:
            raise ValueError(f'{owner}: attn_cfg is a list of {len(attn_cfg)} kernel configs but the model has '
                             f'{num} {unit}s; give one config for all, or exactly {num} (one per {unit})')
        cfgs = list(attn_cfg)
    else:
        cfgs = [attn_cfg] * num
    out = []
    for i, cfg in enumerate(cfgs):
        try:
            out.append(normalize_cfg(cfg))
        except (KeyError, TypeError, ValueError) as e:
            raise type(e)(f'{owner}: attn_cfg for {unit} {i}: {e}') from None
    return out


def require_kernel_fit(cfg: dict, owner: str, where: str, *, needs_mask: bool = False,
                       varying_length: bool = False) -> type:
    """The kernel class for ``cfg``; a clear build-time error when the backbone must hand it a mask it can't take,
    or token sequences whose length varies with the input size to a kernel tied to fixed positions."""
    cls = kernel_class(cfg)
    if varying_length and cls.fixed_length:
        raise ValueError(f"{owner}: attention kernel '{cfg['type']}' cannot be used in {where}: its learned "
                         'weights are tied to token positions up to a fixed length, and there the number of tokens '
                         'varies with the input size; kernels that fit: '
                         f"{', '.join(n for n in list_attentions() if not kernel_class(n).fixed_length)}")
    if needs_mask and not cls.supports_mask:
        raise ValueError(f"{owner}: attention kernel '{cfg['type']}' cannot be used in {where}: it needs "
                         'attention masks (shifted windows / padded tokens) and the kernel cannot honour a mask; '
                         f"kernels that can: {', '.join(n for n in list_attentions() if kernel_class(n).supports_mask)}")
    return cls


def padded_key_mask(valid_hw, padded_hw, device) -> torch.Tensor:
    """(Hp*Wp,) bool: True for real tokens of a grid padded bottom/right from ``valid_hw`` to ``padded_hw``."""
    (h, w), (hp, wp) = valid_hw, padded_hw
    m = torch.zeros(hp, wp, dtype=torch.bool, device=device)
    m[:h, :w] = True
    return m.flatten()


def nchw(x: torch.Tensor, hw) -> torch.Tensor:
    """(B, N, C) tokens -> (B, C, H, W)."""
    b, n, c = x.shape
    return x.transpose(1, 2).reshape(b, c, hw[0], hw[1]).contiguous()
