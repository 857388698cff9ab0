"""The pipeline's stages, one module each, in the order a group travels.

- :mod:`~trio_rl.loop.stages.dataloader`: admits each item and hands it out;
- :mod:`~trio_rl.loop.stages.workers`: the worker pool and the rollout workers, which sample a group;
- :mod:`~trio_rl.loop.stages.intake`: the trainer's receive side, which carries out the schedule's verdict on a group;
- :mod:`~trio_rl.loop.stages.trainer`: trains each step the schedule decides;
- :mod:`~trio_rl.loop.stages.evaluator`: evaluates the weights the trainer sends.

:func:`trio_rl.loop.pipeline.run_pipeline` wires them; :mod:`~trio_rl.loop.stages.run`
holds what they share, and :mod:`~trio_rl.loop.stages.crashes` tells the trainer a stage's
crash from a cancellation.
"""
