"""A compact memory of what the agent has seen, written into each household prompt.

A tiny model cannot track a 30-step episode through a 2-turn history window; this memory
(receptacles visited and what was there, the object held) is what makes the task learnable.
It reads only observations and the task text (never the simulator), so the observation-only rule
expert (`rule_expert`) reads a transcript's window with it too; sdar's rollout writes it into the
prompt (`sdar.agent.memory.memory_for`).
"""

from __future__ import annotations

import re

from sdar_envs.household.catalog import (
    APPLIANCE,
    OBJECT_TYPES,
    OPENABLE,
    RECEPTACLE_TYPES,
    TOGGLEABLE,
)
from sdar_envs.household.search import listing_order, type_of

_ARRIVE_ON = re.compile(r"You arrive at (?P<r>[\w ]+?)\. On the (?P=r), you see (?P<items>.+?)\.(?:\s|$)")
_ARRIVE_CLOSED = re.compile(r"You arrive at (?P<r>[\w ]+?)\. The (?P=r) is closed\.")
_ARRIVE_OPEN = re.compile(r"You arrive at (?P<r>[\w ]+?)\. The (?P=r) is open\. In it, you see (?P<items>.+?)\.(?:\s|$)")
_ARRIVE_EMPTY = re.compile(r"You arrive at (?P<r>[\w ]+?)\. On the (?P=r), you see nothing\.")
_OPEN = re.compile(r"You open the (?P<r>[\w ]+?)\. The (?P=r) is open\. In it, you see (?P<items>.+?)\.(?:\s|$)")
_PICK = re.compile(r"You pick up the (?P<o>[\w ]+?) from the (?P<r>[\w ]+?)\.")
_MOVE = re.compile(r"You (?:move|put) the (?P<o>[\w ]+?) (?:to|in/on) the (?P<r>[\w ]+?)\.")
_STATE = re.compile(r"You (?P<verb>heat|cool|clean) the (?P<o>[\w ]+?) using the (?P<r>[\w ]+?)\.")
_STATE_WORD = {"heat": "hot", "cool": "cool", "clean": "clean"}
_ROOM = re.compile(r"Looking quickly around you, you see (?P<items>.+?)\.\n")


def _items(text: str) -> list[str]:
    text = text.strip()
    if text == "nothing":
        return []
    parts = re.split(r",\s*(?:and\s+)?|\s+and\s+", text)
    return [re.sub(r"^(a|an|the)\s+", "", p.strip()) for p in parts if p.strip()]


class HouseholdMemory:
    """Tracks visited receptacles, their contents, the held object and its state.

    With `next_place` (the default) the last line names the next place once the memory knows it: the
    receptacle where a task object was seen, the appliance the task's state needs ("heat":
    microwave), the desklamp, the receptacle the task fills ("Next: go to microwave 1."); while
    nothing is known it names the search frontier instead ("Search next: go to cabinet 3.").
    Both are read off what the agent has observed and the task text, never off the simulator.
    A from-scratch tiny model copies such a line reliably but could not work the place out
    itself (right only 24-55% of the time at those turns), so the student's moves become a
    copy and the search order, where the skills text helps, is left as the decision that
    separates the privileged teacher from the student. `next_place=False` is the ablation.
    """

    def __init__(self, task: str = "", next_place: bool = True) -> None:
        # the object and receptacle types the task names ("put a cool apple in diningtable"): task
        # objects are flagged where they were seen, so matching the goal against what is lying around
        # is a lookup in the memory rather than a comparison across the prompt (a tiny model picked up
        # whatever it saw first), and the search frontier is shown only while there is something to
        # search for (a tiny model kept searching with the object in hand)
        words = set(re.findall(r"[a-z]+", task.lower()))
        self.task_objects = words & set(OBJECT_TYPES)
        self.task_receptacles = words & set(RECEPTACLE_TYPES)
        self.seen: dict[str, list[str] | None] = {}  # None = closed, not looked inside
        self.holding: str | None = None
        self.states: dict[str, str] = {}
        self.room: list[str] = []  # every receptacle, from the room description
        self.at: str | None = None  # the receptacle the agent stands at
        self.goal_objects = self.task_objects - set(TOGGLEABLE)
        self.lamps = self.task_objects & set(TOGGLEABLE)
        verbs = {"hot": "heat", "heat": "heat", "cool": "cool", "clean": "clean"}
        states = {verbs[w] for w in words if w in verbs}
        self.appliance = APPLIANCE[states.pop()] if len(states) == 1 else None
        self.next_place = next_place

    def update(self, observation: str) -> None:
        m = _ROOM.search(observation)
        if m:
            self.room = sorted(_items(m["items"]), key=listing_order)
        for pat in (_ARRIVE_OPEN, _OPEN, _ARRIVE_ON):
            m = pat.search(observation)
            if m:
                self.seen[m["r"]] = _items(m["items"])
                self.at = m["r"]
                return
        m = _ARRIVE_EMPTY.search(observation)
        if m:
            self.seen[m["r"]] = []
            self.at = m["r"]
            return
        m = _ARRIVE_CLOSED.search(observation)
        if m:
            self.seen.setdefault(m["r"], None)
            self.at = m["r"]
            return
        m = _PICK.search(observation)
        if m:
            self.holding = m["o"]
            if self.seen.get(m["r"]):
                self.seen[m["r"]] = [o for o in self.seen[m["r"]] if o != m["o"]]
            return
        m = _MOVE.search(observation)
        if m:
            self.holding = None
            self.seen.setdefault(m["r"], [])
            if self.seen[m["r"]] is not None:
                self.seen[m["r"]].append(m["o"])
            return
        m = _STATE.search(observation)
        if m:
            self.states[m["o"]] = _STATE_WORD[m["verb"]]

    def render(self) -> str:
        text = self._render_seen()
        found = self._task_objects_found()
        if self.task_objects:
            text += f" Task objects seen: {'; '.join(f'{o} at {r}' for o, r in found) if found else 'none yet'}."
        unvisited = [r for r in self.room if r not in self.seen]
        if self.room:
            text += f" Not visited: {', '.join(unvisited) if unvisited else 'none'}."
        place = self._next_place(found) if self.next_place else None
        if place is not None:
            text += f" Next: go to {place}."
        elif unvisited and self._searching(found):
            # the search frontier, last in the prompt and worded as the action itself: following it
            # is a plain induction copy after "go to" (as "Next unvisited: X" the tiny model copied
            # the wrong receptacle type a quarter of the time); the skills say when to go elsewhere first
            text += f" Search next: go to {unvisited[0]}."
        return text

    def _task_objects_found(self) -> list[tuple[str, str]]:
        """(object, receptacle) of task objects lying around, except in a receptacle of the type
        the task puts them in (already placed, e.g. the first of two)."""
        return [(o, r) for r, items in self.seen.items() if type_of(r) not in self.task_receptacles
                for o in (items or []) if type_of(o) in self.task_objects]

    def _visible(self, r: str) -> bool:
        # contents known (visited and open, or a surface), or a surface never visited
        return self.seen[r] is not None if r in self.seen else type_of(r) not in OPENABLE

    def _first(self, places: list[str]) -> str | None:
        order = {r: i for i, r in enumerate(self.room)}
        return min(places, key=lambda r: (not self._visible(r), order.get(r, len(order)))) if places else None

    def _next_place(self, found: list[tuple[str, str]]) -> str | None:
        """Where the task goes next when that place is known (None while searching, when the
        next action is not a move, or without a task): the receptacle of a task object seen,
        the appliance the task's state needs, the desklamp, the receptacle the task fills."""
        if not self.goal_objects:
            return None
        if self.holding is None:
            here = [r for o, r in found if type_of(o) in self.goal_objects]
            if not here or self.at in here:
                return None
            return self._first(here)
        if type_of(self.holding) not in self.goal_objects:
            return None  # put it down first
        if self.lamps:
            lamps = [r for o, r in found if type_of(o) in self.lamps]
            place = None if not lamps or self.at in lamps else self._first(lamps)
        elif self.appliance and self.holding not in self.states:
            apps = [r for r in self.room if type_of(r) == self.appliance]
            place = None if not apps or self.at in apps else apps[0]
        else:
            dests = [r for r in self.room if type_of(r) in self.task_receptacles]
            if not dests:
                return None
            order = {r: i for i, r in enumerate(self.room)}

            def key(r: str) -> tuple[int, bool, bool, int]:
                done = sum(1 for o in self.seen.get(r) or [] if type_of(o) in self.goal_objects)
                return (-done, r != self.at, not self._visible(r), order[r])

            best = min(dests, key=key)
            place = None if best == self.at else best
        return place

    def _searching(self, found: list[tuple[str, str]]) -> bool:
        """Whether to show the search frontier: always without a task; else while an object type the
        task names was never seen, or while the hands are empty and no task object is known."""
        if not self.task_objects:
            return True
        seen_types = {type_of(o) for items in self.seen.values() for o in (items or [])}
        if self.holding:
            seen_types.add(type_of(self.holding))
        return bool(self.task_objects - seen_types) or (self.holding is None and not found)

    def _render_seen(self) -> str:
        if not self.seen and self.holding is None:
            return "Seen: nothing yet. Holding: nothing."
        seen = "; ".join(
            f"{r}: {'closed' if items is None else (', '.join(items) if items else 'nothing')}"
            for r, items in self.seen.items()
        )
        held = "nothing"
        if self.holding:
            state = self.states.get(self.holding)
            held = f"{self.holding} ({state})" if state else self.holding
        return f"Seen: {seen or 'nothing yet'}. Holding: {held}."
