"""Installs tfgc.

TensorFlow is not a hard requirement, because its CPU and GPU builds are
different distributions (`tensorflow-cpu`, `tensorflow`) and either one
satisfies tfgc; pick one with the `cpu` or `gpu` extra.

The custom ops (`custom_ops/`) are compiled into `tfgc/ops/_tfgc_ops.so`
against the TensorFlow importable at build time, so build without isolation:
`pip install --no-build-isolation -e .` (or `.`). Without TensorFlow, a
compiler, or on a failed compile, the install still succeeds with a warning
and tfgc uses its pure-TensorFlow reference ops; `python -m custom_ops.build`
compiles them later.
"""

import os
import sys
import warnings

import setuptools
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
OPS_EXTENSION = "tfgc.ops._tfgc_ops"


class BuildCustomOps(build_ext):
    """Compiles the TF custom ops with `custom_ops/build.py`, never fatally."""

    def get_ext_filename(self, fullname):
        # The loader expects a plain `_tfgc_ops.so`, not an ABI-tagged name;
        # distutils passes the last component, setuptools the full name.
        if fullname == OPS_EXTENSION:
            return os.path.join(*OPS_EXTENSION.split(".")) + ".so"
        if fullname == OPS_EXTENSION.rsplit(".", 1)[1]:
            return fullname + ".so"
        return super().get_ext_filename(fullname)

    def run(self):
        inplace, self.inplace = self.inplace, 0
        target = self.get_ext_fullpath(OPS_EXTENSION)
        self.inplace = inplace
        try:
            sys.path.insert(0, HERE)
            from custom_ops import build as ops_build

            ops_build.build(output=target, verbose=bool(self.verbose))
        except Exception as e:  # noqa: BLE001 - install without the ops
            warnings.warn(
                "tfgc: the custom ops were not built; tfgc will use its "
                f"pure-TensorFlow reference ops. Reason: {e}",
                stacklevel=1,
            )
            self.extensions = [
                x for x in self.extensions if x.name != OPS_EXTENSION
            ]
        finally:
            if sys.path and sys.path[0] == HERE:
                sys.path.pop(0)
        super().run()

    def build_extension(self, ext):
        if ext.name != OPS_EXTENSION:  # built in run()
            super().build_extension(ext)


TF_VERSION = ">=2.21,<2.22"

setuptools.setup(
    name="tfgc",
    version="0.1.0",
    description=(
        "Gradient compression for Keras 3 under "
        "tf.distribute.MultiWorkerMirroredStrategy"
    ),
    packages=setuptools.find_packages(include=["tfgc", "tfgc.*"]),
    ext_modules=[setuptools.Extension(OPS_EXTENSION, sources=[])],
    cmdclass={"build_ext": BuildCustomOps},
    python_requires=">=3.10",
    install_requires=[
        "keras>=3.15,<3.16",
        "absl-py>=2.0",
        "numpy>=1.26",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu{TF_VERSION}"],
        "gpu": [f"tensorflow{TF_VERSION}"],
        "models": ["tensorflow-datasets>=4.9"],
        "demo": ["scikit-learn>=1.3"],
        # The benchmark lab's plots (benchmarks/lab/report.py).
        "bench": ["matplotlib>=3.7"],
        # matplotlib: tests/benchmarks runs the lab end to end. ruff is
        # pinned: CI checks the tree with it, and versions format apart.
        "test": [
            "pytest>=8",
            "hypothesis>=6",
            "scikit-learn>=1.3",
            "matplotlib>=3.7",
            "ruff==0.17.6",
        ],
    },
)
