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
    assert m.room and m.render().endswith("Not visited: " + ", ".join(m.room) + f". Search next: go to {m.room[0]}.")
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
    assert m.render().endswith(f"Search next: go to {unvisited[0]}." if unvisited else "Not visited: none.")


def test_memory_flags_the_objects_the_task_names_where_they_were_seen():
    m = HouseholdMemory("put a cool apple in diningtable.")
    m.update("Looking quickly around you, you see a cabinet 1, a countertop 1, a diningtable 1, and a drawer 2.\n")
    assert m.render().endswith("Task objects seen: none yet. Not visited: cabinet 1, countertop 1, diningtable 1, "
                               "drawer 2. Search next: go to cabinet 1.")
    m.update("You arrive at countertop 1. On the countertop 1, you see a apple 1, a pineapple 1, and a knife 1.")
    m.update("You arrive at drawer 2. On the drawer 2, you see a apple 3.")
    # whole words only (pineapple is not an apple); every sighting in visiting order; a task object is
    # known and the hands are empty: nothing to search for, so no frontier
    assert m.render().endswith("Task objects seen: apple 1 at countertop 1; apple 3 at drawer 2. "
                               "Not visited: cabinet 1, diningtable 1.")
    m.update("You pick up the apple 1 from the countertop 1.")
    text = m.render()
    assert "Task objects seen: apple 3 at drawer 2." in text and "Holding: apple 1." in text
    assert "Search next" not in text  # the object is in hand: go cool it, not search
    # objects already in a receptacle of the type the task names are placed, not candidates
    m.update("You move the apple 1 to the diningtable 1.")
    assert "apple 1 at diningtable 1" not in m.render()
    # without a task (other callers) the memory is task-free and always shows the frontier
    plain = HouseholdMemory()
    plain.update("Looking quickly around you, you see a cabinet 1, and a drawer 2.\n")
    assert "Task objects" not in plain.render() and plain.render().endswith("Search next: go to cabinet 1.")


def test_memory_keeps_searching_for_a_task_object_never_seen():
    # examine the pillow with the desklamp: pillow in hand, lamp not found yet -> keep searching
    m = HouseholdMemory("examine the pillow with the desklamp.")
    m.update("Looking quickly around you, you see a bed 1, a desk 1, and a shelf 1.\n")
    m.update("You arrive at bed 1. On the bed 1, you see a pillow 1.")
    m.update("You pick up the pillow 1 from the bed 1.")
    assert m.render().endswith("Not visited: desk 1, shelf 1. Search next: go to desk 1.")
    m.update("You arrive at desk 1. On the desk 1, you see a desklamp 1.")
    assert m.render().endswith("Task objects seen: desklamp 1 at desk 1. Not visited: shelf 1.")


def test_episode_memory_gets_the_task_of_a_sim_episode():
    from sdar.agent.rollout import EpisodeState

    env = make_env("household")
    out = env.reset(task_id=env.task_ids("test")[3])
    state = EpisodeState(out, "household", True, env.task_text)
    assert state.mem.task_objects and "Task objects seen:" in state.view(0, 10).memory
