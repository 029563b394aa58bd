"""hpcvm: near-native virtual machines for HPC, and the proof."""

__version__ = "0.1.0"
