from sdar.agent.memory import HouseholdMemory, NoMemory
from sdar_envs import make_env


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


def test_memory_names_the_next_place_once_it_is_known_by_hand():
    m = HouseholdMemory("heat some apple and put it in countertop")
    m.update("Looking quickly around you, you see a cabinet 1, a countertop 1, a countertop 2, a drawer 1, "
             "a microwave 1, and a sinkbasin 1.\n")
    assert m.render().endswith("Search next: go to cabinet 1.")  # nothing known yet: search
    m.update("You arrive at drawer 1. On the drawer 1, you see a apple 2.")
    assert m.render().endswith("Task objects seen: apple 2 at drawer 1. Not visited: cabinet 1, countertop 1, "
                               "countertop 2, microwave 1, sinkbasin 1.")  # standing at it: take, no go-to
    m.update("You arrive at cabinet 1. The cabinet 1 is closed.")
    assert m.render().endswith("Next: go to drawer 1.")  # the task object's place, not the frontier
    m.update("You arrive at drawer 1. On the drawer 1, you see a apple 2.")
    m.update("You pick up the apple 2 from the drawer 1.")
    assert m.render().endswith("Next: go to microwave 1.")  # "heat": the appliance first
    m.update("You arrive at microwave 1. The microwave 1 is closed.")
    assert "Next:" not in m.render() and "Search next" not in m.render()  # here: open, heat
    m.update("You heat the apple 2 using the microwave 1.")
    assert m.render().endswith("Next: go to countertop 1.")  # then the receptacle the task fills
    m.update("You arrive at countertop 1. On the countertop 1, you see nothing.")
    assert "Next:" not in m.render()  # here: put it down
    # holding something the task does not need: put it down first, no place to go
    other = HouseholdMemory("heat some apple and put it in countertop")
    other.update("You arrive at drawer 1. On the drawer 1, you see a egg 1.")
    other.update("You pick up the egg 1 from the drawer 1.")
    assert "Next:" not in other.render()
    # without the plan (an ablation), only the search frontier is ever named
    plain = HouseholdMemory("heat some apple and put it in countertop", next_place=False)
    plain.update("Looking quickly around you, you see a cabinet 1, a drawer 1, and a microwave 1.\n")
    plain.update("You arrive at drawer 1. On the drawer 1, you see a apple 2.")
    plain.update("You pick up the apple 2 from the drawer 1.")
    assert "Next:" not in plain.render()


def test_memory_next_place_for_two_objects_and_the_desklamp_by_hand():
    two = HouseholdMemory("put two cd in safe")
    two.update("Looking quickly around you, you see a drawer 1, a drawer 2, a safe 1, and a shelf 1.\n")
    two.update("You arrive at shelf 1. On the shelf 1, you see a cd 1, and a cd 2.")
    two.update("You pick up the cd 1 from the shelf 1.")
    assert two.render().endswith("Next: go to safe 1.")
    two.update("You arrive at safe 1. The safe 1 is open. In it, you see nothing.")
    two.update("You move the cd 1 to the safe 1.")
    assert two.render().endswith("Next: go to shelf 1.")  # the second cd; the first is placed
    lamp = HouseholdMemory("look at book under the desklamp")
    lamp.update("Looking quickly around you, you see a bed 1, a desk 1, and a sidetable 1.\n")
    lamp.update("You arrive at sidetable 1. On the sidetable 1, you see a desklamp 1.")
    assert lamp.render().endswith("Search next: go to bed 1.")  # the book is not known: search
    lamp.update("You arrive at bed 1. On the bed 1, you see a book 1.")
    lamp.update("You pick up the book 1 from the bed 1.")
    assert lamp.render().endswith("Next: go to sidetable 1.")  # the lamp, not the book's place


def test_uninformed_expert_goes_where_the_memory_says():
    """Every `go to` of the listing-order expert (the student's teacher in the warm start) is the
    memory's "Next: go to X" or, while searching, its "Search next: go to X": the student's moves
    are a copy of the prompt, and only the skills give a reason to go elsewhere."""
    import re

    env = make_env("household")
    followed = total = 0
    for task_id in env.task_ids("train")[:40]:
        out = env.reset(task_id=task_id)
        m = HouseholdMemory(env.task_text)
        m.update(out.observation)
        while not out.done:
            a = env.uninformed_expert_action()
            if a.startswith("go to "):
                hint = re.search(r"(?:Search next|Next): go to ([^.]+)\.$", m.render())
                total += 1
                followed += bool(hint) and hint.group(1) == a[len("go to "):]
            out = env.step(a)
            m.update(out.observation)
    assert total > 100 and followed / total >= 0.98, (followed, total)
