"""Hydra config groups, shipped inside the package as ``marl.configs``."""
