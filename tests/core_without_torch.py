"""Check that trio_rl's core works without torch: imports, a FakeBackend run, a TinkerBackend run.

    python tests/core_without_torch.py            # in a venv without torch (CI: .ci/run)
    python tests/core_without_torch.py --block    # anywhere: make torch unimportable first

The TinkerBackend run goes through the SDK stand-in of ``tests/tinker_sdk_standin.py``,
as ``tests/test_tinker_pipeline.py`` does. Exits 0 and prints one line per check.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCKED = ("torch",)


def main(argv: Sequence[str]) -> int:
    if "--block" in argv:
        for name in BLOCKED:
            # What Python does for a module that is not installed: find_spec is None, import raises.
            sys.modules[name] = None  # type: ignore[assignment]
    for name in BLOCKED:
        assert importlib.util.find_spec(name) is None, (
            f"{name} is importable: this check needs a venv without it (or --block)"
        )
    sys.path.insert(0, str(ROOT))

    import trio

    import trio_rl
    import trio_rl.backends
    import trio_rl.cli
    import trio_rl.testing

    assert not [m for m, module in sys.modules.items() if m.split(".")[0] in BLOCKED and module is not None]
    print("ok: trio_rl, trio_rl.testing, trio_rl.backends and trio_rl.cli import without torch")
    try:
        trio_rl.backends.LocalBackend  # noqa: B018  (the lazy import is the point)
    except ImportError as error:
        assert "trio_rl[local]" in str(error), error
        print(f"ok: LocalBackend names its extra: {error}")
    else:
        raise AssertionError("LocalBackend imported without torch")

    from tests.tinker_sdk_standin import open_standin_service
    from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec

    with tempfile.TemporaryDirectory() as tmp:
        dataset = FakeDataset(num_batches=3, batch_size=2, spec=FakeEnvSpec(group_size=2))
        config = trio_rl.Config(log_path=Path(tmp, "fake"), eval_every=0, save_every=0)
        result = trio_rl.run(config, dataset=dataset, backend=FakeBackend())
        assert result.final_step == 3, result.final_step
        print(f"ok: a FakeBackend run trained {result.final_step} steps")

        async def tinker_run() -> trio_rl.TrainResult:
            with open_standin_service(sdk_style="0.38", latency_s=0.001) as service, trio.fail_after(60):
                async with trio_rl.backends.TinkerBackend(service_client=service) as backend:
                    config = trio_rl.Config(log_path=Path(tmp, "tinker"), eval_every=0, save_every=0, max_tokens=4)
                    return await trio_rl.train(config, dataset=dataset, backend=backend)

        result = trio.run(tinker_run)
        assert result.final_step == 3, result.final_step
        print(f"ok: a TinkerBackend run (SDK stand-in) trained {result.final_step} steps")
    assert not [m for m, module in sys.modules.items() if m.split(".")[0] in BLOCKED and module is not None]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
