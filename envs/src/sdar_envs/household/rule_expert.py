"""The household's observation-only rule expert: a turn's prompt (task, recent turns, observation, admissible list,
memory block) -> the next action, never the environment's state; sdar serves it as a replay teacher
(`sdar.replay.experts.rule_expert`). It searches as the sim's gold policy does (`search.HouseholdSearch`), over what
the messages show, and reads a prompt without a memory block with the agent's memory (`memory.HouseholdMemory`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sdar_envs.household.catalog import (
    APPLIANCE,
    CAN_CONTAIN,
    OBJECT_TYPES,
    OPENABLE,
    RECEPTACLE_TYPES,
    TOGGLEABLE,
)
from sdar_envs.household.memory import HouseholdMemory
from sdar_envs.household.search import HouseholdSearch, listing_order, type_of
from sdar_envs.transcript import Turn

_STATE_OF = {"clean": "clean", "hot": "hot", "heat": "hot", "cool": "cool"}
_VERB_OF = {"hot": "heat", "cool": "cool", "clean": "clean"}
_MEMORY = re.compile(r"^Seen: (?P<seen>.*?)\. Holding: (?P<held>[^.]*)\.(?: Task objects seen: [^.]*\.)?"
                     r"(?: Not visited: (?P<todo>[^.]*)\.)?")
_HELD = re.compile(r"^(?P<o>.+?)(?: \((?P<s>\w+)\))?$")
# observations that say where the agent stands, newest first wins
_WHERE = tuple(re.compile(p) for p in (
    r"You arrive at (?P<r>[\w ]+?)\.",
    r"You (?:open|close) the (?P<r>[\w ]+?)\.",
    r"You pick up the [\w ]+? from the (?P<r>[\w ]+?)\.",
    r"You (?:move|put) the [\w ]+? (?:to|in/on) the (?P<r>[\w ]+?)\.",
    r"You (?:heat|cool|clean) the [\w ]+? using the (?P<r>[\w ]+?)\.",
    r"You are facing the (?P<r>[\w ]+?)\.",
    r"^On the (?P<r>[\w ]+?), you see",
    r"^The (?P<r>[\w ]+?) is (?:open|closed)\.",
))
_MIDDLE = re.compile(r"You are in the middle of a room|-= Welcome")
_LAMP_ON = re.compile(r"You turn on the (?P<o>[\w ]+?)\.")


@dataclass
class _Goal:
    """What the task asks: object type, receptacle type (None: the lamp task), state. "Two objects"
    needs nothing of its own: placed ones sit in the goal's receptacle, where no search looks."""

    obj: str
    dest: str | None
    state: str | None = None  # "hot" | "cool" | "clean"
    lamp: bool = False

    @classmethod
    def parse(cls, task: str) -> _Goal:
        words = re.findall(r"[a-z]+", task.lower())
        objs = [i for i, w in enumerate(words) if w in OBJECT_TYPES and w not in TOGGLEABLE]
        first = objs[0] if objs else 0
        dests = [w for w in words[first + 1:] if w in RECEPTACLE_TYPES]
        states = [_STATE_OF[w] for w in words if w in _STATE_OF]
        lamp = any(w in TOGGLEABLE or w == "lamp" for w in words)
        return cls(obj=words[first] if objs else "", dest=None if lamp or not dests else dests[-1],
                   state=states[0] if states else None, lamp=lamp)


@dataclass
class _Room:
    """The household as the messages show it."""

    room: list[str]  # every receptacle, by type then number
    seen: dict[str, list[str] | None]  # contents; None = closed, never looked inside
    holding: str | None = None
    state: str | None = None  # of the held object
    loc: str | None = None
    loc_known: bool = True
    closed: set[str] = field(default_factory=set)  # closed again after being seen open
    remembered: bool = True  # from the memory block; else only the visible window

    def visible(self, r: str) -> bool:
        if r in self.closed:
            return False
        return self.seen[r] is not None if r in self.seen else type_of(r) not in OPENABLE

    def reach(self, r: str) -> str | None:
        """The step that puts `r` in front of the agent, open; None when it already is."""
        if self.loc != r:
            return f"go to {r}"
        return None if self.visible(r) else f"open {r}"


def _items(text: str) -> list[str] | None:
    if text == "closed":
        return None
    return [] if text == "nothing" else text.split(", ")


def _read_room(view: Turn) -> _Room:
    observations = [o for o, _ in view.history] + [view.observation]
    m = _MEMORY.match(view.memory) if view.memory else None
    if m:
        seen: dict[str, list[str] | None] = {}
        if m["seen"] != "nothing yet":
            for entry in m["seen"].split("; "):
                r, _, items = entry.partition(": ")
                seen[r] = _items(items)
        held = _HELD.match(m["held"])
        holding = None if m["held"] == "nothing" else held["o"]
        state = held["s"] if holding else None
        todo = [] if not m["todo"] or m["todo"] == "none" else m["todo"].split(", ")
        room = sorted(set(seen) | set(todo), key=listing_order)
        k = _Room(room, seen, holding, state)
    else:  # no memory: what the recent window shows, plus the admissible list
        mem = HouseholdMemory(view.task, next_place=False)
        for obs in observations:
            mem.update(obs)
        k = _Room(list(mem.room), dict(mem.seen), mem.holding, remembered=False)
        goes = [a[len("go to "):] for a in view.admissible_actions if a.startswith("go to ")]
        examined = [a[len("examine "):] for a in view.admissible_actions if a.startswith("examine ")]
        here = [x for x in examined if type_of(x) in RECEPTACLE_TYPES]
        k.room = sorted(set(k.room) | set(goes) | set(here) | set(k.seen), key=listing_order)
        held = [x for x in examined if type_of(x) not in RECEPTACLE_TYPES]
        if held and k.holding is None:  # only the held object can be examined besides where one stands
            k.holding = held[0]
        k.state = mem.states.get(k.holding or "")
    _locate(k, observations, view.admissible_actions)
    return k


def _locate(k: _Room, observations: list[str], admissible: list[str]) -> None:
    """Where the agent stands (newest telling observation), and what it closed again."""
    for obs in observations:
        for r in re.findall(r"You close the ([\w ]+?)\.", obs):
            k.closed.add(r)
        for r in re.findall(r"(?:You open the|The) ([\w ]+?) is open\.", obs):
            k.closed.discard(r)
    for obs in reversed(observations):
        if _MIDDLE.search(obs):
            k.loc = None
            return
        lamp = _LAMP_ON.search(obs)
        if lamp:
            k.loc = next((r for r, items in k.seen.items() if lamp["o"] in (items or [])), None)
            k.loc_known = k.loc is not None
            return
        for pattern in _WHERE:
            m = pattern.search(obs)
            if m:
                k.loc = m["r"]
                return
    here = [a[len("examine "):] for a in admissible if a.startswith("examine ")]
    here = [r for r in here if r in k.room]
    k.loc, k.loc_known = (here[0] if here else None), bool(admissible)


def household_rule_action(view: Turn, variant: str = "default") -> str:
    """The household rule expert's next action (`EXPERT_VARIANTS`) from what the turn's prompt shows."""
    goal = _Goal.parse(view.task)
    k = _read_room(view)
    action = _household_step(goal, k, variant) if k.loc_known else "look"  # "look" says where it is
    if view.admissible_actions and action not in view.admissible_actions:
        return "look"
    return action


def _household_step(goal: _Goal, k: _Room, variant: str) -> str:
    rank = listing_order if variant == "default" else (lambda r: (type_of(r), -listing_order(r)[1]))
    if k.holding is not None:
        if type_of(k.holding) != goal.obj:
            return _drop(k)
        if goal.lamp:
            lamps = [(o, r) for r, items in k.seen.items() for o in items or [] if type_of(o) in TOGGLEABLE]
            if not lamps:
                return _search(k, "desklamp", None, variant)
            o, r = min(lamps, key=lambda x: (x[1] != k.loc, rank(x[1])))
            return f"go to {r}" if k.loc != r else f"use {o}"
        if goal.state and k.state != goal.state:
            verb = _VERB_OF[goal.state]
            apps = [r for r in k.room if type_of(r) == APPLIANCE[verb]]
            if not apps:
                return "look"
            app = k.loc if k.loc in apps else apps[0]
            return f"go to {app}" if k.loc != app else f"{verb} {k.holding} with {app}"
        dests = [r for r in k.room if type_of(r) == goal.dest]
        if not dests:
            return "look"

        def fill(r: str) -> tuple[int, bool, bool, tuple[str, int]]:
            done = sum(1 for o in k.seen.get(r) or [] if type_of(o) == goal.obj)
            return (-done, r != k.loc, not k.visible(r), rank(r))

        dest = min(dests, key=fill)
        return k.reach(dest) or f"move {k.holding} to {dest}"
    found = [(o, r) for r, items in k.seen.items() if r not in k.closed and (goal.lamp or type_of(r) != goal.dest)
             for o in items or [] if type_of(o) == goal.obj]
    if found:
        o, r = min(found, key=lambda x: (x[1] != k.loc, not k.visible(x[1]), rank(x[1])))
        return k.reach(r) or f"take {o} from {r}"
    return _search(k, goal.obj, goal.dest, variant)


def _search(k: _Room, otype: str, skip: str | None, variant: str) -> str:
    """Next step of a search for `otype`: the household search (`search.HouseholdSearch`, the sim's gold policy's
    ranking) over the receptacles the messages show unsearched (never seen inside, or closed again). b ranks by
    prior per step. With only the recent window known, it sweeps on from where the agent stands."""

    def steps(r: str) -> int:
        return 1 if r == k.loc else 1 + (type_of(r) in OPENABLE and not k.visible(r))

    search = HouseholdSearch(otype, skip, per_step=None if variant == "default" else steps)
    holds = search.ranked(k.room)
    todo = [r for r in holds if k.seen.get(r) is None or r in k.closed]
    if not todo:  # nowhere likely is left: anywhere not yet seen, in the search's order (`HouseholdSearch.first`)
        holds = sorted(k.room, key=search.key)
        todo = [r for r in holds if k.seen.get(r) is None or r in k.closed]
    if not k.remembered and k.loc in holds:
        # only the recent window is known: sweep on from where the agent stands instead of circling back
        at = holds.index(k.loc)
        todo = [r for r in holds[at + 1:] + holds[:at + 1] if k.seen.get(r) is None]
    if k.loc in todo and not k.visible(k.loc):
        return f"open {k.loc}"
    if not todo:
        return "look"
    return k.reach(todo[0]) or "look"


def _drop(k: _Room) -> str:
    """Put down what the task does not need, as close as possible."""
    held = k.holding or ""
    if k.loc and k.visible(k.loc) and type_of(held) in CAN_CONTAIN.get(type_of(k.loc), ()):
        return f"move {held} to {k.loc}"
    holders = [r for r in k.room if type_of(held) in CAN_CONTAIN.get(type_of(r), ())]
    if not holders:
        return "look"
    r = min(holders, key=lambda r: (not k.visible(r), listing_order(r)))
    return k.reach(r) or f"move {held} to {r}"
