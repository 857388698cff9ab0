"""trio_rl.cli.progress: the tqdm bar on a terminal, plain lines elsewhere."""

from __future__ import annotations

import io

from trio_rl.cli.progress import REWARD_KEY, RunProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def step(n: int, reward: float) -> dict[str, object]:
    return {
        "step": n,
        "progress/groups": 4,
        "progress/trained_groups": 4 * (n + 1),
        REWARD_KEY: reward,
        "async/staleness_max": n % 2,
        "env/all/total_ac_tokens": 100,
        "env/all/total_ob_tokens": 50,
    }


def feed(progress: RunProgress, total: int) -> None:
    for n in range(total):
        record = step(n, 0.5 + n / 100)
        if n == 9:
            record["eval/accuracy"] = 0.25
        progress.update(record)
    progress.update({"step": total, "run/final_step": total, "eval/accuracy": 0.75})
    progress.close()


def test_off_a_terminal_a_plain_line_every_n_steps_and_at_the_last() -> None:
    out = io.StringIO()
    feed(RunProgress(out, total_steps=25, eval_keys=["eval/accuracy"], every=10), 25)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in out.getvalue()
    assert [line.split()[1] for line in lines] == ["10/25", "20/25", "25/25"]
    assert "reward 0.590" in lines[0] and "accuracy 0.250" in lines[0]
    assert "stale<=1" in lines[0] and "groups/s" in lines[0] and "k tok/s" in lines[0]
    # Elapsed and remaining time, from tqdm's meter.
    assert "<" in lines[0].split("[")[1]
    assert "reward 0.740" in lines[2]


def test_on_a_terminal_a_bar_redrawn_in_place() -> None:
    out = Terminal()
    feed(RunProgress(out, total_steps=25, eval_keys=["eval/accuracy"]), 25)
    text = out.getvalue()
    assert "\r" in text and "25/25" in text and "reward 0.740" in text
    assert text.endswith("\n")


def test_the_final_record_alone_draws_nothing() -> None:
    out = io.StringIO()
    progress = RunProgress(out, total_steps=None, every=1)
    progress.update({"step": 0, "run/final_step": 0})
    progress.close()
    assert out.getvalue() == ""


def test_a_resumed_run_counts_its_earlier_steps_as_done() -> None:
    out = io.StringIO()
    progress = RunProgress(out, total_steps=30, every=5)
    for n in range(20, 30):
        progress.update(step(n, 0.5))
    progress.close()
    assert [line.split()[1] for line in out.getvalue().splitlines()] == ["25/30", "30/30"]

    terminal = Terminal()
    progress = RunProgress(terminal, total_steps=30)
    progress.update(step(20, 0.5))
    progress.close()
    assert "21/30" in terminal.getvalue() and "1/30" not in terminal.getvalue().replace("21/30", "")
