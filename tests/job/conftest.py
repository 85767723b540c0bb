"""The example job's tests: its modules on the path, and one generated dataset."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The job's modules import one another as siblings, as they do when train.py runs as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "train_job"))


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small generated dataset (3,000 train, 1,000 held out), written once per session."""
    import make_data

    root = tmp_path_factory.mktemp("digits")
    make_data.write_dataset(root, train=3000, test=1000, seed=0)
    return root
