"""Where users' models are: transformers 5's experts interface (transformers.py) and TorchTitan-style
MoE layers (torchtitan.py). Neither imports its framework at `import mxmoe`."""
