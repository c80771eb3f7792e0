"""hetbench: one computation across GPUs of different vendors, measured honestly."""

__version__ = "0.1.0"
