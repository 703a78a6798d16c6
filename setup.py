"""Package list: `sglang_dsv41` plus the top-level `kernels/` folder mapped to
`sglang_dsv41.kernels`."""

from setuptools import find_packages, setup

packages = find_packages(include=["sglang_dsv41", "sglang_dsv41.*"]) + ["sglang_dsv41.data"]
packages += ["sglang_dsv41.kernels"] + [
    "sglang_dsv41.kernels." + p for p in find_packages(where="kernels")
]
setup(packages=packages)
