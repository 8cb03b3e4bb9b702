"""Reading ALFWorld's engine back: its PDDL state as the view the sim's checks read (`EngineFacts`), the goal
of a PDDL problem (`parse_goal`), and the fast domain-recipe gold planner (`domain_plan`) that
`alfworld_engine.AlfworldEngine` tries before fast-downward. Writing a scene as a game is in household/pddl.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


class EngineFacts:
    """The engine's current PDDL state, indexed like the sim's `SimGame` (so `sim.diagnose` and
    `progress.ProgressTracker` read it), plus what `domain_plan` needs: locations, object states,
    PDDL type names.

    env: TextWorld's PddlEnv after the ALFWorld demangler renamed its entities.
    """

    def __init__(self, env: Any) -> None:
        names = {k: info.name.strip() for k, info in env._entity_infos.items()}
        facts = [(f.name, [a.name for a in f.arguments]) for f in env._pddl_state.facts]
        by_pred: dict[str, list[list[str]]] = {}
        for name, args in facts:
            by_pred.setdefault(name, []).append(args)
        recs = sorted({a[0] for a in by_pred.get("receptacletype", [])})
        objs = sorted({a[0] for a in by_pred.get("objecttype", [])})
        self.rname = [names[r] for r in recs]
        self.oname = [names[o] for o in objs]
        self.rindex = {n: i for i, n in enumerate(self.rname)}
        self.oindex = {n: i for i, n in enumerate(self.oname)}
        self.rtype = [n.rpartition(" ")[0] for n in self.rname]
        self.otype = [n.rpartition(" ")[0] for n in self.oname]
        ridx = {r: i for i, r in enumerate(recs)}
        oidx = {o: i for i, o in enumerate(objs)}
        # PDDL type names (lower case, e.g. "sinkbasintype") of each receptacle and object
        self.rpddl = [""] * len(recs)
        self.opddl = [""] * len(objs)
        for r, t in by_pred.get("receptacletype", []):
            self.rpddl[ridx[r]] = t
        for o, t in by_pred.get("objecttype", []):
            self.opddl[oidx[o]] = t
        self.rloc = [""] * len(recs)
        for r, loc in by_pred.get("receptacleatlocation", []):
            if r in ridx:
                self.rloc[ridx[r]] = loc
        unary = {
            p: {a[0] for a in by_pred.get(p, [])}
            for p in ("openable", "opened", "ishot", "iscool", "isclean", "istoggled")
        }
        self.openable = [r in unary["openable"] for r in recs]
        self.opened = [r in unary["opened"] for r in recs]
        self.state = {
            p: [o in unary[p] for o in objs] for p in ("ishot", "iscool", "isclean", "istoggled")
        }
        # the sim's names for the same flags (`progress.ProgressTracker` reads either view)
        self.hot, self.cool, self.clean = self.state["ishot"], self.state["iscool"], self.state["isclean"]
        self.can_contain = {(a[0], a[1]) for a in by_pred.get("cancontain", [])}
        self.agent_loc = next((a[1] for a in by_pred.get("atlocation", [])), "")
        here = [i for i, loc in enumerate(self.rloc) if loc == self.agent_loc]
        self.loc: int | None = here[0] if here else None
        self.held: int | None = next(
            (oidx[a[1]] for a in by_pred.get("holds", []) if a[1] in oidx), None
        )
        self.where = [-1] * len(objs)
        for o, r in by_pred.get("inreceptacle", []):
            if o in oidx and r in ridx:
                self.where[oidx[o]] = ridx[r]

    def _visible(self, r: int) -> bool:
        return not self.openable[r] or self.opened[r]


@dataclass
class GoalSpec:
    """What an ALFWorld goal asks for, read off the PDDL problem's (:goal ...).

    object_type / receptacle_type / toggle_type: PDDL type names in lower case ("appletype").
    state: "isclean" | "ishot" | "iscool" the object needs, else None. count: 2 for pick_two.
    """

    object_type: str
    receptacle_type: str | None = None
    toggle_type: str | None = None
    state: str | None = None
    count: int = 1


_GOAL_OBJ = re.compile(r"\(objecttype \?(o|o1|o2) (\w+)\)")
_GOAL_TOGGLE = re.compile(r"\(objecttype \?ot (\w+)\)")
_GOAL_RECEP = re.compile(r"\(receptacletype \?r (\w+)\)")
_GOAL_STATE = re.compile(r"\((isclean|ishot|iscool) \?o\)")
_APPLIANCE = {
    "isclean": ("sinkbasintype", "clean"),
    "ishot": ("microwavetype", "heat"),
    "iscool": ("fridgetype", "cool"),
}


def parse_goal(pddl_problem: str) -> GoalSpec:
    """The `GoalSpec` of an ALFWorld PDDL problem (official or exported by `pddl.write_game`)."""
    text = pddl_problem.lower()
    idx = text.find("(:goal")
    if idx < 0:
        raise ValueError("the PDDL problem has no (:goal ...) section")
    goal = " ".join(text[idx:].split())
    objs = {m.group(2) for m in _GOAL_OBJ.finditer(goal)}
    if len(objs) != 1:
        raise ValueError(f"cannot read the target object type off the goal: {goal[:300]}")
    toggle = _GOAL_TOGGLE.search(goal)
    recep = _GOAL_RECEP.search(goal)
    state = _GOAL_STATE.search(goal)
    return GoalSpec(
        object_type=objs.pop(),
        receptacle_type=recep.group(1) if recep else None,
        toggle_type=toggle.group(1) if toggle else None,
        state=state.group(1) if state else None,
        count=2 if "?o2" in goal else 1,
    )


class _Plan:
    """A plan being written, and the facts as it changes them: where the agent is, what is open, where each
    object is, what is held."""

    def __init__(self, view: EngineFacts) -> None:
        self.view = view
        self.loc = view.agent_loc
        self.opened = list(view.opened)
        self.where = list(view.where)
        self.held = view.held
        self.steps: list[str] = []

    def goto(self, r: int) -> None:
        if self.loc != self.view.rloc[r]:
            self.steps.append(f"go to {self.view.rname[r]}")
            self.loc = self.view.rloc[r]

    def reveal(self, r: int) -> None:
        if self.view.openable[r] and not self.opened[r]:
            self.steps.append(f"open {self.view.rname[r]}")
            self.opened[r] = True

    def cost(self, r: int) -> tuple[int, int]:
        return (int(self.loc != self.view.rloc[r]) + int(self.view.openable[r] and not self.opened[r]), r)

    def take(self, o: int) -> None:
        r = self.where[o]
        self.goto(r)
        self.reveal(r)
        self.steps.append(f"take {self.view.oname[o]} from {self.view.rname[r]}")
        self.where[o], self.held = -1, o

    def put(self, o: int, r: int) -> None:
        self.goto(r)
        self.reveal(r)
        self.steps.append(f"move {self.view.oname[o]} to {self.view.rname[r]}")
        self.where[o], self.held = r, None


def domain_plan(view: EngineFacts, goal: GoalSpec) -> list[str] | None:
    """A gold path for the six ALFWorld task types, from the facts, in milliseconds.

    It knows where everything is (like the PDDL planner) and follows the recipe fetch -> (heat |
    cool | clean) -> place, or fetch -> go to the lamp -> use it. Not always the shortest plan,
    but fast-downward's optimal search takes minutes on some kitchens; callers check each step
    and fall back to fast-downward when a step is not admissible or the plan ends without a win.
    None when the recipe does not apply (e.g. nothing of the target type exists).
    """
    plan = _Plan(view)
    targets = [o for o, t in enumerate(view.opddl) if t == goal.object_type]
    if not targets:
        return None
    if plan.held is not None and plan.held not in targets:
        # put the wrong object down first, where it can go: here if possible, else the nearest
        ok = [
            r
            for r in range(len(view.rname))
            if (view.rpddl[r], view.opddl[plan.held]) in view.can_contain
        ]
        if not ok:
            return None
        plan.put(plan.held, min(ok, key=plan.cost))
    if goal.toggle_type is not None:  # look_at_obj_in_light
        return _light_plan(plan, goal, targets)
    return _placement_plan(plan, goal, targets)


def _light_plan(plan: _Plan, goal: GoalSpec, targets: list[int]) -> list[str] | None:
    """look_at_obj_in_light: hold a target, go to a lamp, use it."""
    view, where = plan.view, plan.where
    lamps = [o for o, t in enumerate(view.opddl) if t == goal.toggle_type and where[o] >= 0]
    if not lamps:
        return None
    if plan.held is None:
        free = [o for o in targets if where[o] >= 0]
        if not free:
            return None
        plan.take(min(free, key=lambda o: (plan.cost(where[o]), o)))
    lamp = min(lamps, key=lambda o: plan.cost(where[o]))
    plan.goto(where[lamp])
    plan.steps.append(f"use {view.oname[lamp]}")
    return plan.steps


def _placement_plan(plan: _Plan, goal: GoalSpec, targets: list[int]) -> list[str] | None:
    """The placing task types: fetch each missing target, give it the goal's state, put it in the destination."""
    view, where = plan.view, plan.where
    if goal.receptacle_type is None:
        return None
    dests = [r for r, t in enumerate(view.rpddl) if t == goal.receptacle_type]
    if not dests:
        return None

    def ready(o: int) -> bool:
        return goal.state is None or view.state[goal.state][o]

    def done_in(r: int) -> int:
        return sum(1 for o in targets if where[o] == r and ready(o))

    dest = min(dests, key=lambda r: (-done_in(r), plan.cost(r)))
    needed = goal.count - done_in(dest)
    for _ in range(needed):
        if plan.held is None:
            # a target already at a destination still counts as a source when it lacks its state
            pool = [o for o in targets if where[o] >= 0 and not (where[o] == dest and ready(o))]
            if not pool:
                return None
            plan.take(min(pool, key=lambda o: (plan.cost(where[o]), o)))
        o = plan.held
        assert o is not None
        if not ready(o):
            app_type, verb = _APPLIANCE[goal.state]
            apps = [r for r, t in enumerate(view.rpddl) if t == app_type]
            if not apps:
                return None
            app = min(apps, key=plan.cost)
            plan.goto(app)
            plan.steps.append(f"{verb} {view.oname[o]} with {view.rname[app]}")
        plan.put(o, dest)
    return plan.steps
