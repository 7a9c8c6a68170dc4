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

        # loaded means every op of _library.OPS is registered
        if not cute_moe.library_loaded():
            raise RuntimeError(f"CUTE_MOE_REQUIRE_LIBRARY=1 but the op library is not loaded: {_library.load_error()}")
