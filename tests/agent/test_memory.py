from sdar.agent.memory import HouseholdMemory, NoMemory
from sdar.envs import make_env


def test_memory_tracks_receptacles_holding_and_state_by_hand():
    m = HouseholdMemory()
    m.update("You arrive at countertop 1. On the countertop 1, you see a apple 1, and a knife 1.")
    m.update("You arrive at fridge 1. The fridge 1 is closed.")
    assert m.render() == "Seen: countertop 1: apple 1, knife 1; fridge 1: closed. Holding: nothing."
    m.update("You open the fridge 1. The fridge 1 is open. In it, you see a egg 2.")
    m.update("You pick up the apple 1 from the countertop 1.")
    m.update("You heat the apple 1 using the microwave 1.")
    assert m.render() == "Seen: countertop 1: knife 1; fridge 1: egg 2. Holding: apple 1 (hot)."
    m.update("You move the apple 1 to the diningtable 1.")
    assert m.holding is None and m.seen["diningtable 1"] == ["apple 1"]
    assert NoMemory().render() == ""


def test_memory_follows_a_real_sim_episode():
    env = make_env("household")
    out = env.reset(task_id=env.task_ids("test")[3])
    m = HouseholdMemory()
    m.update(out.observation)
    assert m.room and m.render().endswith("Not visited: " + ", ".join(m.room) + f". Next unvisited: {m.room[0]}.")
    picked = None
    while not out.done:
        a = env.expert_action()
        out = env.step(a)
        m.update(out.observation)
        if a.startswith("take "):
            picked = a.split(" from ")[0][5:]
            assert m.holding == picked
    assert out.metadata["won"]
    assert m.seen, "the expert visited receptacles; memory must list them"
    assert all(r not in m.render().split("Not visited:")[1] for r in m.seen if r in m.room)
    unvisited = [r for r in m.room if r not in m.seen]
    assert m.render().endswith(f"Next unvisited: {unvisited[0]}." if unvisited else "Not visited: none.")
