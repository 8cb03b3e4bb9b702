from sdar.demo import ToyConfig, run_arm
from sdar.cli import main


def test_every_arm_learns_the_toy_task():
    cfg = ToyConfig(steps=30)
    for arm in ("grpo", "grpo_opsd", "sdar"):
        h = run_arm(arm, cfg)
        assert sum(x["reward"] for x in h[-5:]) / 5 > sum(x["reward"] for x in h[:5]) / 5 + 0.15
    assert run_arm("grpo_opsd", cfg)[-1]["gate"] == 0.5


def test_selfcheck_exits_zero(capsys):
    assert main(["demo", "--selfcheck", "--mode", "quick"]) == 0
    assert "self-check passed" in capsys.readouterr().out
