"""Demo code, apart from the library: the training demo's model (a TorchTitan-style MoE transformer),
data (a synthetic language), a transformers Qwen3-MoE wrapper (hf_qwen3.py) and the `python -m mxmoe
train` driver (train.py, imported by that command only)."""

from .data import SyntheticLanguage, make_batches
from .model import MoEModelArgs, MoETransformer

__all__ = ["SyntheticLanguage", "make_batches", "MoEModelArgs", "MoETransformer"]
