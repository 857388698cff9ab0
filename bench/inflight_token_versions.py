"""Run examples/arithmetic.py and count how many in-flight tokens came from weights newer than their client's.

    python bench/inflight_token_versions.py --log-path runs/counted --seed 0 --inflight-weights

Every flag goes to the example. ``LocalSamplingClient.sample`` is wrapped to
compare each token's version with its in-flight client's (the loop names the
weights of version ``v`` ``f"{v:06d}"``, the client's ``model_path``); the
counts are printed on stderr at exit: ``same``, ``newer`` (the token met a
publish: its request sampled weights published after its client) and ``older``
(never expected).
"""

from __future__ import annotations

import atexit
import collections
import runpy
import sys
from pathlib import Path

from tinker import types as tinker_types

from trio_rl.backends.local.sampler import LocalSamplingClient
from trio_rl.backends.protocol import token_versions

counts: collections.Counter[str] = collections.Counter()
_sample = LocalSamplingClient.sample


async def _counted(
    self: LocalSamplingClient,
    prompt: tinker_types.ModelInput,
    num_samples: int,
    sampling_params: tinker_types.SamplingParams,
) -> tinker_types.SampleResponse:
    response = await _sample(self, prompt, num_samples, sampling_params)
    if self._engine.inflight and self.model_path is not None:
        client_version = int(Path(self.model_path).name)
        for sequence in response.sequences:
            for version in token_versions(sequence) or []:
                kind = "newer" if version > client_version else "same" if version == client_version else "older"
                counts[kind] += 1
    return response


if __name__ == "__main__":
    LocalSamplingClient.sample = _counted  # type: ignore[method-assign]
    atexit.register(lambda: print(f"token versions against their client's: {dict(counts)}", file=sys.stderr))
    example = Path(__file__).resolve().parents[1] / "examples" / "arithmetic.py"
    sys.argv = [str(example), *sys.argv[1:]]
    runpy.run_path(str(example), run_name="__main__")
