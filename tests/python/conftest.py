# Makes the in-tree package importable when it is not installed (e.g. on the GPU machine,
# where the op library is carried in python/cute_moe/lib).
import importlib.util
import os
import sys

if importlib.util.find_spec("cute_moe") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def pytest_configure(config):
    # scripts/test.sh builds the op library, so there a missing library is a failure,
    # not a reason to skip the op tests.
    if os.environ.get("CUTE_MOE_REQUIRE_LIBRARY") == "1":
        import cute_moe
        from cute_moe import _library

        if not cute_moe.library_loaded():
            raise RuntimeError(f"CUTE_MOE_REQUIRE_LIBRARY=1 but the op library is not loaded: {_library._load_error}")
        import torch

        wanted = ("grouped_mm_swiglu", "grouped_mm_act", "gather_rows", "gather_sum_rows", "gather_rows_dot")
        if not all(hasattr(torch.ops.cute_moe, op) for op in wanted):
            raise RuntimeError(f"CUTE_MOE_REQUIRE_LIBRARY=1 but the op library lacks one of {wanted}")
