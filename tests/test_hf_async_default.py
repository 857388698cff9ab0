"""The README's default async configuration trains on HFBackend unchanged (with a model to load)."""

from __future__ import annotations

from pathlib import Path

from tests.hf_helpers import backend
from tests.integration.tiny_model import TinyModel
from tests.test_async_loss import assert_trained_with_tis, readme_config
from trio_rl import run
from trio_rl.testing import FakeDataset


def test_the_readme_default_trains_on_hf_backend(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = readme_config(tmp_path / "run", base_model=tiny_model.path, max_tokens=8)
    result = run(config, dataset=FakeDataset(num_batches=5, batch_size=4), backend=backend(tmp_path / "hf"))
    assert_trained_with_tis(result, tmp_path / "run")
