"""The in-process backends' settings objects refuse bad values before any work, naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trio_rl.backends.local import EngineSettings, LocalBackend


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"max_batch_rows": 0}, "max_batch_rows must be at least 1"), ({"prefix_cache_bytes": -1}, "prefix_cache_bytes")],
)
def test_engine_settings_refuse_bad_values(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineSettings(**fields)


def test_local_backend_refuses_zero_threads_and_keeps_its_engine_settings(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_threads must be at least 1"):
        LocalBackend(log_dir=tmp_path, num_threads=0)
    backend = LocalBackend(log_dir=tmp_path, engine=EngineSettings(max_batch_rows=3, prefix_cache_bytes=0))
    assert (backend._runtime.max_batch_rows, backend._runtime.prefix_cache_bytes) == (3, 0)
