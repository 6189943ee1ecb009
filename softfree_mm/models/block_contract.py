"""Attention transfer's block contract, checked when the model is built: every teacher block runs on a probe image,
takes its tokens as its first positional argument and returns one tensor shaped as them; and which student blocks
compute what their teacher twins do (left out of the loss and of what trains)."""
import copy
from typing import List, Set

import torch
from torch import nn


def check_blocks(net: nn.Module, teacher: List[tuple], student: List[tuple], size: int) -> Set[int]:
    """The block contract, on a ``size`` x ``size`` image through the teacher ``net`` (one error naming the block and
    the family): every block runs, takes its tokens as its first positional argument, returns one tensor shaped as
    them. ``teacher`` and ``student``: the (path, block) pairs of the teacher's and the student's blocks, in module
    order (``transfer.blocks_of``). Returns the indices of the student blocks that compute what the teacher's twin
    does (the same state dict, and with the twin's weights the same output, bit for bit, on the twin's input)."""
    family = type(net).__name__
    calls = {}

    def record(i):
        def hook(module, args, kwargs, output):
            calls.setdefault(i, (args, kwargs, output))
        return hook

    handles = [b.register_forward_hook(record(i), with_kwargs=True) for i, (_, b) in enumerate(teacher)]
    image = torch.randn(1, getattr(net, 'in_channels', 3), size, size,
                        generator=torch.Generator().manual_seed(0))  # the global random streams stay as they are
    failure = None
    try:
        with torch.no_grad():
            net(image)
    except Exception as e:  # noqa: BLE001  (a block breaking the contract breaks the blocks after it)
        failure = e
    finally:
        for h in handles:
            h.remove()
    same = set()
    for i, (path, block) in enumerate(teacher):
        if i not in calls and failure is not None:
            raise ValueError(f'AttentionTransfer: the teacher {family} does not run on a {size}x{size} image '
                             f'(probe_size): {type(failure).__name__}: {failure}') from failure
        if i not in calls:
            raise ValueError(f"AttentionTransfer: block {path} of {family} never runs in the teacher's forward: "
                             "transfer matches every block on the teacher's own output; build teacher and student "
                             'so that every block runs (the classification layout: out_indices / out_type up to '
                             'the last block)')
        args, kwargs, out = calls[i]
        if not args or not torch.is_tensor(args[0]):
            raise ValueError(f'AttentionTransfer: block {path} of {family} is not called with its tokens as its '
                             f'first positional argument ({len(args)} positional, keywords {sorted(kwargs)}): '
                             "transfer hands each student block its twin's input there")
        if not torch.is_tensor(out) or out.shape != args[0].shape:
            got = (f'a tensor of shape {tuple(out.shape)}' if torch.is_tensor(out) else
                   f'a {type(out).__name__}' + (f' of {len(out)}' if isinstance(out, (tuple, list)) else ''))
            raise ValueError(f'AttentionTransfer: block {path} of {family} returns {got}, not one tensor shaped as '
                             f'its input {tuple(args[0].shape)}: transfer compares each block\'s output with its '
                             "twin's")
        twin = dict(student)[path]
        mine, theirs = twin.state_dict(), block.state_dict()
        if {k: v.shape for k, v in mine.items()} != {k: v.shape for k, v in theirs.items()}:
            continue
        probe = copy.deepcopy(twin).eval()
        probe.load_state_dict(theirs)
        try:
            with torch.no_grad():
                if torch.equal(probe(*args, **kwargs), out):
                    same.add(i)
        except Exception:  # noqa: BLE001  (a layout that cannot take the twin's call computes something else)
            pass
    return same
