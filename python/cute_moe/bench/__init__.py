# cute_moe.bench: `python -m cute_moe.bench`, the MoE layer benchmark against a
# torchtitan-style PyTorch layer (see __main__.py for the command line).
from .configs import CONFIGS, DEFAULT_CONFIGS, BenchConfig

__all__ = ["BenchConfig", "CONFIGS", "DEFAULT_CONFIGS", "main"]


def main(argv=None) -> int:
    from .__main__ import main as _main
    return _main(argv)
