"""The training demo's model (a TorchTitan-style MoE transformer) and data (a synthetic language)."""

from .data import SyntheticLanguage, make_batches
from .model import MoEModelArgs, MoETransformer

__all__ = ["SyntheticLanguage", "make_batches", "MoEModelArgs", "MoETransformer"]
