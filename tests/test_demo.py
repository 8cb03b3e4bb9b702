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


def test_demo_parallel_reaches_the_runner_and_bad_values_are_named(monkeypatch, capsys):
    import pytest

    import sdar.pipeline.cli as pipeline_cli

    seen = {}
    monkeypatch.setattr(pipeline_cli, "run_comparison", lambda **kw: seen.update(kw) or {"status": "SUCCEEDED"})
    assert main(["demo", "--mode", "smollm2", "--parallel", "1"]) == 0
    assert seen["parallelism"] == 1 and seen["config_path"] == "configs/household-smollm2.yaml"
    assert main(["demo", "--mode", "quick"]) == 0 and seen["parallelism"] is None  # the runner's default, 2
    for bad in ("3", "0", "two"):
        for argv in (["demo", "--parallel", bad], ["run", "--local", "--parallel", bad]):
            with pytest.raises(SystemExit) as exc:
                main(argv)
            assert exc.value.code == 2
            assert f"'{bad}': the local runner trains 1 to 2 arms at once" in capsys.readouterr().err
