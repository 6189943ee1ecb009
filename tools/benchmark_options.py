"""The option values of tools/benchmark.py: each converts an option's text, or refuses it with the line that says
why (an argparse type through :func:`refusing`)."""
import argparse

DTYPE_NAMES = ('fp32', 'bf16', 'fp16')


def refusing(fn):
    """An argparse type from ``fn``: its ValueError / KeyError / TypeError message becomes the error line."""
    def convert(text):
        try:
            return fn(text)
        except (KeyError, TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(e.args[0] if e.args else str(e)) from None
    convert.__name__ = fn.__name__
    return convert


def parse_size(text):
    parts = text.lower().split('x')
    try:
        h, w = (int(parts[0]), int(parts[0])) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    except ValueError:
        raise ValueError(f'image size must be HxW or one number, got {text!r}') from None
    if len(parts) > 2 or min(h, w) < 32:
        raise ValueError(f'image size must be HxW (each >= 32), got {text!r}')
    return h, w


def kernel_spec(text, plain_products=False):
    if plain_products and text.startswith('peer:'):  # another project's kernel (benchmark.kernels.PEERS)
        from softfree_mm.analysis.benchmark.kernels import PEERS
        if text[len('peer:'):] not in PEERS:
            raise ValueError(f"unknown peer {text!r}; known: {', '.join('peer:' + p for p in PEERS)}")
        return text
    from softfree_mm.attention import normalize_cfg, parse_kernel
    cfg = parse_kernel(text)
    if not (plain_products and cfg == 'matmul'):  # kernels mode also times the plain products
        normalize_cfg(cfg)
    return cfg


def kernel_or_layout_kernel(text):
    """A kernel spec, or one of the cost sweep's kernel names (the configs' attention names: poly3, ...)."""
    from softfree_mm.analysis.benchmark.cost_layouts import KERNEL_NAMES
    return text if text in KERNEL_NAMES else kernel_spec(text)


def backbone_name(name):
    from softfree_mm.analysis.benchmark.backbones import backbone_presets
    if name not in backbone_presets():
        raise ValueError(f"unknown backbone {name!r}; valid: {', '.join(sorted(backbone_presets()))}")
    return name


def at_least(low):
    def check(text):
        value = int(text)
        if value < low:
            raise ValueError(f'must be >= {low}, got {value}')
        return value
    return check


def dtype_name(text):
    if text not in DTYPE_NAMES:
        raise ValueError(f'must be fp32, bf16 or fp16, got {text!r}')
    return text


def positive(text):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or value != value or value == float('inf'):
        raise ValueError(f'must be a positive number, got {text!r}')
    return value


def clock_name(text):
    if text not in ('wall', 'cpu'):
        raise ValueError(f'must be wall or cpu, got {text!r}')
    return text
