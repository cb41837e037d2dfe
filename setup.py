"""Installs the application's modules inside the ``causallm`` package.

The repository keeps NNTrainer's layout: main.py, factory.py, models/ and layers/ at its root,
the embedded model in res/tiny-llama. An installed copy holds them as causallm/main.py,
causallm/factory.py, causallm/models, causallm/layers and causallm/res/tiny-llama, the names
the code imports them by (in the source tree, causallm/__init__.py adds the root to the
package's path instead). An editable install needs no copy.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = ["main.py", "factory.py"]
TREES = ["models", "layers", os.path.join("res", "tiny-llama")]


class BuildWithApplication(build_py):
    def run(self):
        if not getattr(self, "editable_mode", False):  # no stale file of an earlier build
            shutil.rmtree(os.path.join(self.build_lib, "causallm"), ignore_errors=True)
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = os.path.join(self.build_lib, "causallm")
        for name in MODULES:
            shutil.copy2(os.path.join(HERE, name), os.path.join(target, name))
        for tree in TREES:
            dst = os.path.join(target, tree)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(os.path.join(HERE, tree), dst,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))


setup(cmdclass={"build_py": BuildWithApplication})
