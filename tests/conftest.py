"""Test-wide settings.

- Tests marked `gpu` need a CUDA device: they skip cleanly where there is none (CI).
- Hypothesis draws the same examples on every run (profile `ci`), so a red CI run reproduces
  on any machine; HYPOTHESIS_PROFILE=explore draws fresh, and more, examples to look for new
  failures.
"""

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False, max_examples=400)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
