"""No-progress error sites of accepted household actions, shared by the sim and the ALFWorld engine.

An action the engine accepts can still make no progress toward the goal the task text names: taking
an object the task does not ask for, going back to a receptacle already searched, putting the task
object in the wrong place, processing what needs no processing. `ProgressTracker` keeps the little
per-episode memory this needs (which receptacles the agent has seen into) and marks such steps;
both backends call it on their pre-step view, so the two mark the same steps (the fidelity check
compares them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sdar_envs.household import wording as W
from sdar_envs.household.catalog import APPLIANCE, TASK_STATE, TASK_TEMPLATES

# error_kind of each no-progress site (the action was accepted: `valid_action` stays True)
NO_PROGRESS_KINDS = (
    "non_task_object",  # took an object of a type the task does not ask for
    "revisit_nothing_new",  # went back to a searched receptacle that holds nothing the task needs
    "wrong_receptacle",  # put the task object somewhere the task does not say
    "skipped_process",  # put the task object in place before heating/cooling/cleaning it
    "wrong_process",  # heated/cooled/cleaned/sliced/lit something the task does not ask for
)
# hint_template_key of each site (texts in skills.HINT_TEMPLATES)
NO_PROGRESS_HINTS = (
    "household/non_task_object",
    "household/revisit_nothing_new",
    "household/wrong_receptacle",
    "household/keep_holding",
    "household/process_first",
    "household/wrong_process",
    "household/no_process_needed",
    "household/already_processed",
    "household/lamp_not_needed",
)
# the adjective the task text uses for each state ("put a hot apple in ..."), and the view's
# per-object flag list of it
STATE_WORD = {"heat": "hot", "cool": "cool", "clean": "clean"}
_FLAG = {"heat": "hot", "cool": "cool", "clean": "clean"}

Error = tuple[str, str, dict[str, str]]


@dataclass(frozen=True)
class TaskGoal:
    """What a household task text asks for, read off the text alone (ALFWorld's goal templates).

    obj: the object type ("apple"); receptacle: where it goes (None for the lamp task);
    toggle: the lamp ("desklamp") of the lamp task; state: "heat" | "cool" | "clean" | None.
    """

    task_type: str
    obj: str
    receptacle: str | None
    toggle: str | None
    state: str | None
    text: str

    @property
    def wanted(self) -> tuple[str, ...]:
        """The object types the task needs to handle or find: the object, and the lamp."""
        return (self.obj, self.toggle) if self.toggle else (self.obj,)


def _template_pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{obj\}|\{recep\}|\{toggle\})", template)
    groups = {"{obj}": r"(?P<obj>\w+)", "{recep}": r"(?P<recep>\w+)", "{toggle}": r"(?P<toggle>\w+)"}
    return re.compile("^" + "".join(groups.get(p, re.escape(p)) for p in parts) + "$")


# type names are single words, so no template matches another's text ("put a clean apple in x"
# is not "put a {obj} in {recep}")
_TEMPLATES = [(t, _template_pattern(x)) for t, xs in TASK_TEMPLATES.items() for x in xs]


def parse_task(text: str) -> TaskGoal | None:
    """The goal of a task text such as 'heat some apple and put it in diningtable' (a final '.'
    and the 'Your task is to: ' prefix allowed); None for a text no ALFWorld template wrote."""
    clean = W.normalize(text).removeprefix("your task is to:").strip().rstrip(".")
    for task_type, pattern in _TEMPLATES:
        m = pattern.match(clean)
        if m:
            g = m.groupdict()
            state = TASK_STATE[task_type]
            return TaskGoal(task_type, g["obj"], g.get("recep"), g.get("toggle"), state, clean)
    return None


class ProgressTracker:
    """One episode's no-progress check: `check(view, action)` before an accepted action is applied.

    `view` is the backend's state before the action: a `sim.SimGame` or an `engine_plan.EngineFacts`, both
    with rname, rindex, rtype, oname, oindex, otype, where, loc, held, hot, cool, clean, _visible(r).
    The tracker remembers which receptacles the agent has seen into (gone to while open, opened, or
    examined while open); since only the agent moves things, what it saw there is still true.
    Everything a marked step's `error_args` holds comes from the task text or the action.
    """

    def __init__(self, task_text: str) -> None:
        self.goal = parse_task(task_text)
        self.seen: set[str] = set()

    def check(self, view: Any, action: str) -> Error | None:
        """(error_kind, hint_template_key, error_args) when accepted `action` makes no progress
        toward the goal, else None; call it for every accepted action (it updates the memory)."""
        p = W.parse_action(action)
        if p is None or self.goal is None:
            return None
        action = W.normalize(action)
        r = view.rindex.get(p.target) if p.target is not None else None
        if p.verb == "go" and r is not None:
            error = self._revisit(view, r, action)
            if view._visible(r):
                self.seen.add(view.rname[r])
            return error
        if p.verb == "open" and r is not None:
            self.seen.add(view.rname[r])
        elif p.verb == "examine" and r is not None and view.loc == r and view._visible(r):
            self.seen.add(view.rname[r])
        elif p.verb in ("take", "move", "heat", "cool", "clean", "slice", "use"):
            o = view.oindex.get(p.obj)
            if o is not None:
                return self._act(view, p, o, r, action)
        return None

    # ---- the rules ----------------------------------------------------------------------------
    def _args(self, action: str, **more: str) -> dict[str, str]:
        g = self.goal
        assert g is not None
        args = {"action": action, "task": g.text, "target": g.obj}
        if g.receptacle:
            args["goal_receptacle"] = g.receptacle
        if g.toggle:
            args["toggle"] = g.toggle
        if g.state:
            args.update(state=STATE_WORD[g.state], needed=g.state, appliance=APPLIANCE[g.state])
        return {**args, **more}

    def _ready(self, view: Any, o: int) -> bool:
        """Whether object o already has the state the task asks for (always, when it asks none)."""
        state = self.goal.state if self.goal else None
        return state is None or bool(getattr(view, _FLAG[state])[o])

    def _revisit(self, view: Any, r: int, action: str) -> Error | None:
        """Going back to a receptacle already seen into, where nothing the task needs lies and
        which is not where the held task object must go next."""
        g = self.goal
        assert g is not None
        if view.rname[r] not in self.seen:
            return None
        if any(view.where[o] == r and t in g.wanted for o, t in enumerate(view.otype)):
            return None
        held = view.held
        if held is not None and view.otype[held] != g.obj:
            return None  # it needs somewhere to put down what it should not hold
        if held is not None and g.receptacle is not None:
            need = g.receptacle if self._ready(view, held) else APPLIANCE[g.state]  # type: ignore[index]
            if view.rtype[r] == need:
                return None
        name = view.rname[r]
        return "revisit_nothing_new", "household/revisit_nothing_new", self._args(
            action, receptacle=name, wanted=" or ".join(g.wanted)
        )

    def _act(self, view: Any, p: W.ParsedAction, o: int, r: int | None, action: str) -> Error | None:
        g = self.goal
        assert g is not None
        otype = view.otype[o]
        args = self._args(action, object=view.oname[o], receptacle=p.target or "")
        if p.verb == "take":
            if otype not in g.wanted:
                return "non_task_object", "household/non_task_object", args
            return None
        if p.verb == "move":
            if otype != g.obj or r is None:
                return None  # putting down a wrong object undoes a mistake
            if g.receptacle is None:
                return "wrong_receptacle", "household/keep_holding", args
            if view.rtype[r] != g.receptacle:
                return "wrong_receptacle", "household/wrong_receptacle", args
            if not self._ready(view, o):
                return "skipped_process", "household/process_first", args
            return None
        if p.verb == "use":
            if g.toggle is None:
                return "wrong_process", "household/lamp_not_needed", args
            return None
        # heat / cool / clean / slice
        args["verb"] = p.verb
        if p.verb == "slice" or g.state is None or otype != g.obj:
            return "wrong_process", "household/no_process_needed", args
        if p.verb != g.state:
            return "wrong_process", "household/wrong_process", args
        if self._ready(view, o):
            return "wrong_process", "household/already_processed", args
        return None
