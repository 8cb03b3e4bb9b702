"""Each family served from its own process on 127.0.0.1: an expert episode played over the wire must be
the local episode exactly (observations, rewards, metadata), and state(t) must read it back."""

from __future__ import annotations

import importlib.util

import pytest

from sdar_envs.base import METADATA_KEYS, make_env

FAMILIES = ("household", "shop", "searchqa")


def _family_or_skip(family: str) -> None:
    # only a missing family module skips; a family that exists but breaks must fail
    if importlib.util.find_spec(f"sdar_envs.{family}") is None:
        pytest.skip(f"sdar_envs.{family} is not in this checkout yet")


@pytest.fixture(scope="module", params=FAMILIES)
def served(request):
    family = request.param
    _family_or_skip(family)
    from sdar_envs.launcher import serve_in_background

    url, handle = serve_in_background(family)
    yield family, url
    handle.stop()


def _expert_local(family: str, task_id: str, max_steps: int = 60):
    env = make_env(family)
    steps = [env.reset(task_id=task_id)]
    actions = []
    while not steps[-1].done and len(actions) < max_steps:
        actions.append(env.expert_action())
        steps.append(env.step(actions[-1]))
    observations = [env.state(t) for t in range(len(steps))]
    env.close()
    return actions, steps, observations


def test_expert_episodes_over_the_wire_equal_local_ones(served):
    from sdar_envs.client import RemoteEnv

    family, url = served
    with RemoteEnv(url, family) as env:
        test_ids = env.task_ids("test")
        assert test_ids == make_env(family).task_ids("test")
        for task_id in (test_ids[0], test_ids[len(test_ids) // 2]):
            actions, expected, observations = _expert_local(family, task_id)
            got = [env.reset(task_id=task_id)] + [env.step(a) for a in actions]
            assert got[0].metadata["task_id"] == task_id and got[0].metadata["task"] == expected[0].metadata["task"]
            for t, (g, e) in enumerate(zip(got, expected, strict=True)):
                assert (g.observation, g.reward, g.done) == (e.observation, e.reward, e.done), (family, task_id, t)
                for key in METADATA_KEYS:
                    assert g.metadata[key] == e.metadata[key], (family, task_id, t, key)
                assert g.metadata["step"] == t
            assert got[-1].done and got[-1].metadata["won"] is True
            for t in (0, len(got) // 2, len(got) - 1):
                assert env.state(t) == observations[t]
                assert env.observation_at(t) == got[t]


def test_unknown_task_and_invalid_action_over_the_wire(served):
    from sdar_envs.client import EnvServerError, RemoteEnv

    family, url = served
    with RemoteEnv(url, family) as env:
        with pytest.raises(EnvServerError, match=f"family '{family}' has no task 'no-such-task'"):
            env.reset(task_id="no-such-task")
        first = env.reset(seed=11)
        out = env.step("xyzzy plugh")  # no family understands this
        assert out.metadata["valid_action"] is False and out.metadata["error_kind"]
        assert out.metadata["hint_template_key"] and out.metadata["step"] == 1
        assert env.state(0) == first.observation


@pytest.mark.slow
@pytest.mark.alfworld
def test_household_on_the_real_alfworld_engine_over_the_wire():
    _family_or_skip("household")
    from sdar_envs.household.alfworld_backend import resolve_data_root

    try:
        resolve_data_root()
    except Exception as exc:  # the official games are not on this machine
        pytest.skip(f"ALFWorld games not found: {exc}")
    from sdar_envs.client import RemoteEnv
    from sdar_envs.launcher import serve_in_background

    url, handle = serve_in_background("household", backend="alfworld")
    with handle, RemoteEnv(url, "household") as env:
        task_id = env.task_ids("test")[0]
        local = make_env("household", backend="alfworld")
        try:
            expected = [local.reset(task_id=task_id)]
            got = [env.reset(task_id=task_id)]
            while not expected[-1].done and len(expected) <= 50:
                action = local.expert_action()
                expected.append(local.step(action))
                got.append(env.step(action))
        finally:
            local.close()
        assert [g.observation for g in got] == [e.observation for e in expected]
        assert [g.metadata["admissible_actions"] for g in got] == [e.metadata["admissible_actions"] for e in expected]
        assert got[-1].metadata["won"] is True and got[-1].reward == expected[-1].reward
        assert env.state(len(got) - 1) == expected[-1].observation


@pytest.mark.alfworld
def test_alfworld_unknown_task_ids_are_404_not_500():
    """A missing game, a path outside the games and an id too long for the file system: 404 with a
    message, over HTTP and the WebSocket, and the session plays a real game right after."""
    _family_or_skip("household")
    from sdar_envs.household.alfworld_backend import resolve_data_root

    try:
        resolve_data_root()
    except Exception as exc:  # the official games are not on this machine
        pytest.skip(f"ALFWorld games not found: {exc}")
    from sdar_envs.client import EnvServerError, RemoteEnv, http_json
    from sdar_envs.launcher import serve_in_background

    url, handle = serve_in_background("household", backend="alfworld")
    with handle:
        created = http_json("POST", f"{url}/sessions")
        sid, token = created["session_id"], created["session_token"]
        bad_ids = ["valid_seen/no-such-task/trial_0/game.tw-pddl", "x" * 1000, "a/" * 400, "../../../etc/passwd", "/etc/hostname"]
        for task_id in bad_ids:
            with pytest.raises(EnvServerError) as err:
                http_json("POST", f"{url}/sessions/{sid}/reset", {"task_id": task_id}, token=token)
            assert err.value.status == 404 and "has no task" in err.value.message, (task_id[:40], err.value)
        with RemoteEnv(url, "household") as env:
            with pytest.raises(EnvServerError, match="no ALFWorld game 'xxxxx") as err:
                env.reset(task_id="x" * 1000)
            assert err.value.code == "EXECUTION_ERROR"
            task_id = env.task_ids("test")[0]
            assert env.reset(task_id=task_id).metadata["task_id"] == task_id
        out = http_json("POST", f"{url}/sessions/{sid}/reset", {"task_id": task_id}, token=token)
        assert out["observation"]["task_id"] == task_id


def _random_action(family: str, md: dict, rng) -> str:
    """A policy with no idea of the task: a random admissible action; search-QA answers a
    random corpus-looking word without searching; the shop searches random words."""
    if family == "searchqa":
        return f"<answer>{rng.choice(['Paris', 'Ruritania', 'blue', '1842', 'river'])}</answer>"
    actions = [a for a in md.get("admissible_actions") or [] if "<" not in a]
    if family == "shop" and (not actions or rng.random() < 0.2):
        return f"search[{' '.join(rng.sample(['red', 'shoes', 'cheap', 'large', 'organic', 'gift'], 2))}]"
    return rng.choice(actions)


def test_random_policy_mostly_loses_over_the_wire(served):
    import random

    from sdar_envs.client import RemoteEnv

    family, url = served
    rng = random.Random(0)
    wins = episodes = 0
    with RemoteEnv(url, family) as env:
        for task_id in env.task_ids("test")[:20]:
            out = env.reset(task_id=task_id)
            for _ in range(60):
                if out.done:
                    break
                out = env.step(_random_action(family, out.metadata, rng))
            episodes += 1
            wins += bool(out.metadata["won"])
    # the expert wins every one of these tasks (test above and the family tests)
    assert wins / episodes <= 0.2, (family, wins, episodes)
