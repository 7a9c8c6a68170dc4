"""Python build of cute-moe: CMake builds the op library, setuptools packages it.

`pip install --no-build-isolation .` configures CMake in $CUTE_MOE_BUILD_DIR (default
./build; an existing configuration there is reused, so the test script builds once),
builds libcute_moe_torch.so against the installed torch and ships it inside the
cute_moe package, next to the pure-Python layers.
"""
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB_NAME = "libcute_moe_torch.so"


class BuildWithCMake(build_py):
    def run(self):
        build_dir = os.path.abspath(os.environ.get("CUTE_MOE_BUILD_DIR", os.path.join(ROOT, "build")))
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            subprocess.check_call([
                "cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja",
                "-DCUTE_MOE_BUILD_TESTS=OFF", f"-DPython3_EXECUTABLE={sys.executable}",
            ])
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir, "-DCUTE_MOE_BUILD_TORCH=ON"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "cute_moe_torch", "-j", str(os.cpu_count() or 2)])
        lib_dir = os.path.join(ROOT, "python", "cute_moe", "lib")
        os.makedirs(lib_dir, exist_ok=True)
        shutil.copy2(os.path.join(build_dir, LIB_NAME), os.path.join(lib_dir, LIB_NAME))
        super().run()


setup(
    name="cute-moe",
    version="0.1.0",
    description="Fused MoE grouped-GEMM kernels for NVIDIA Hopper (SM90) training, with PyTorch ops",
    package_dir={"": "python"},
    packages=["cute_moe", "cute_moe.nn", "cute_moe.ops", "cute_moe.reference", "cute_moe.bench",
              "cute_moe.integrations", "cutlass_op", "cutlass_op.bf16_grouped_mm"],
    package_data={"cute_moe": ["lib/" + LIB_NAME]},
    python_requires=">=3.10",
    install_requires=["torch==2.11.0"],
    cmdclass={"build_py": BuildWithCMake},
)
