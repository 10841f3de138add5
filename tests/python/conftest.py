"""pytest setup for the Python suite.

The tests import the *installed* mxmoe package (scripts/setup.sh does `pip install --no-build-isolation .`,
which builds libmxmoe and packages it in mxmoe/lib/). To run against a development build instead, point
the loader at it: `MXMOE_LIBRARY=build-py/src/core/libmxmoe.so PYTHONPATH=python pytest tests/python`.
Nothing here edits sys.path, so the suite always tests what `import mxmoe` resolves to.

Tests marked `gpu` need a CUDA device and are skipped without one.
"""
import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
