"""Packages `elmo_tf` for Beam workers (`python -m elmo_tf.embed_beam ... --setup_file=./setup.py`).

The commands in this repository need no installation; the dependencies come from requirements.txt
(`--requirements_file=requirements.txt` on Dataflow, or a container image that has them).
"""

import setuptools

setuptools.setup(
    name="elmo_tf",
    version="0.1.0",
    description="ELMo for TensorFlow 2 / Keras 3",
    packages=setuptools.find_namespace_packages(include=["elmo_tf", "elmo_tf.*"]),
    python_requires=">=3.10,<3.13",
)
