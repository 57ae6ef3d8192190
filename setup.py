"""rl-data-tf: RLDS datasets, patterns, replay buffers and a Reverb-compatible replay server on current TF."""
import pathlib

import setuptools

_HERE = pathlib.Path(__file__).parent
_README = (_HERE / "README.md").read_text(encoding="utf-8") if (_HERE / "README.md").exists() else ""

setuptools.setup(
    name="rl-data-tf",
    version="0.1.0",
    description=(
        "The data side of RL on current TensorFlow: RLDS datasets and patterns (rlds_tf), in-graph replay "
        "buffers and a Reverb-compatible replay server (replay_tf). Pure Python, no compiled ops."
    ),
    long_description=_README,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["rlds_tf", "rlds_tf.*", "replay_tf", "replay_tf.*"]),
    package_data={"replay_tf": ["wire/*.proto", "wire/*.sh"], "rlds_tf": ["patterns/*.proto"]},
    install_requires=[
        "tensorflow>=2.16",
        "tensorflow-datasets>=4.9.4",
        "dm-tree",
        "numpy",
        "dm-env",
        "grpcio>=1.60",
        "protobuf>=4.25",
        "cramjam>=2.7",
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-timeout", "gymnasium", "array_record", "nbclient", "nbformat", "ipykernel",
                 "pyyaml", "matplotlib"],
        "gym": ["gymnasium"],
        "array_record": ["array_record"],
        "cli": ["pyyaml", "matplotlib"],  # YAML table configs for `replay-tf serve`; `rlds-tf info --plot`
    },
    entry_points={"console_scripts": [
        "rlds-tf=rlds_tf.cli:main",
        "replay-tf=replay_tf.cli:main",
    ]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
