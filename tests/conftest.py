import os
import numpy as np
import pytest
from ops import patches

@pytest.fixture
def seed() -> int:
  """A fresh seed per test run, printed (pytest shows it on failure); TINYZOO_TEST_SEED=<n> replays a run."""
  seed = int(os.environ.get("TINYZOO_TEST_SEED") or np.random.SeedSequence().entropy % 2**32)
  print(f"TINYZOO_TEST_SEED={seed}")
  return seed

@pytest.fixture
def rng(seed: int) -> np.random.Generator: return np.random.default_rng(seed)

# what the runtime and the CLI install before they compile anything; tests of single ops compile kernels too
patches.install()
