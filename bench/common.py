# Helpers shared by the benchmark scripts. The timing, error, memory, commit and JSON
# helpers are the package's own (cute_moe.bench, cute_moe.testing), so these scripts and
# `python -m cute_moe.bench` measure and record the same way; cute_moe comes from the
# installed package or, failing that, this checkout's python/.
from __future__ import annotations

import os
import sys

try:
    import cute_moe  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from cute_moe.bench.report import git_commit, write_json  # noqa: E402,F401
from cute_moe.bench.runner import peak_bytes, time_ms  # noqa: E402,F401
from cute_moe.testing import rel_error  # noqa: E402,F401


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def import_cute_moe():
    """cute_moe with its op library loaded (a clear error otherwise)."""
    import cute_moe
    from cute_moe._library import require_library
    require_library("the benchmark")
    return cute_moe
