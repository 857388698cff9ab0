"""The base layer, below ``rl/``, ``loop/`` and the configuration: it imports none of them.

- :mod:`~trio_rl.base.determinism`: seeds derived from identities, and settling an instant;
- :mod:`~trio_rl.base.jsonl`: the run folder's ``.jsonl`` files, as a crash may have left them;
- :mod:`~trio_rl.base.reduced_metrics`: metrics that add up over calls by their names' suffix;
- :mod:`~trio_rl.base.splitting`: near-equal contiguous parts of a sequence.
"""
