"""tinker-cookbook recipes on trio_rl: change one import (``trio_rl.cookbook.train``), nothing else.

This package is the one place besides :mod:`trio_rl.asyncio_bridge` that uses
asyncio: a recipe's ``asyncio.run(main(config))`` runs trio_rl as a Trio guest of
that asyncio loop (:mod:`trio_rl.cookbook.host_loop`). It needs tinker-cookbook
installed (``pip install trio_rl[cookbook]``); the rest of trio_rl imports none of it.
"""
