"""One episode of a sim problem: the state, ALFWorld-worded transitions, admissible actions, and why an action that
is not admissible failed (`diagnose`). Its gold policy reads it from beside it: sim_expert."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdar_envs.household import wording as W
from sdar_envs.household.catalog import (
    APPLIANCE,
    CAN_CONTAIN,
    CLEANABLE,
    COOLABLE,
    HEATABLE,
    NOT_PICKUPABLE,
    RECEPTACLE_OBJECTS,
    SHARP,
    SLICEABLE,
    TOGGLEABLE,
)

if TYPE_CHECKING:
    from sdar_envs.household.sim_problem import SimProblem

_VERB_FEEDBACK = {"heat": W.HEATED, "clean": W.CLEANED, "cool": W.COOLED}


# ---- the game ---------------------------------------------------------------------------------
class SimGame:
    """One episode of a `SimProblem`: state, ALFWorld-worded transitions, admissible actions,
    (its gold policy, from any state: `sdar_envs.household.sim_expert.expert_action`)."""

    def __init__(self, problem: SimProblem) -> None:
        self.problem = problem
        self.goal = problem.goal
        recs, objs = problem.receptacles, problem.objects
        self.rname = [r.name for r in recs]
        self.rtype = [r.rtype for r in recs]
        self.ropenable = [r.openable for r in recs]
        self.rindex = {n: i for i, n in enumerate(self.rname)}
        self.oname = [o.name for o in objs]
        self.otype = [o.otype for o in objs]
        self.oindex = {n: i for i, n in enumerate(self.oname)}
        if len(self.rindex) != len(recs) or len(self.oindex) != len(objs):
            raise ValueError(f"problem {problem.task_id} has duplicate receptacle or object names")
        # ALFWorld lists things by type, numbers descending; the expert tries numbers ascending
        self._list_key = [(t, -int(n.rsplit(" ", 1)[1])) for t, n in zip(self.otype, self.oname)]
        self.rorder = sorted(
            range(len(recs)), key=lambda i: (self.rtype[i], int(self.rname[i].rsplit(" ", 1)[1]))
        )
        intro_order = sorted(
            range(len(recs)), key=lambda i: (self.rtype[i], -int(self.rname[i].rsplit(" ", 1)[1]))
        )
        self.goto = [f"go to {n}" for n in self.rname]  # the action that goes to each receptacle
        look = W.LOOK_ROOM.format(items=W.join_items([self.rname[i] for i in intro_order]))
        self.intro = W.INTRO.format(look=look, task=W.TASK_LINE.format(task=problem.task_text))
        # state
        self.loc: int | None = None
        self.held: int | None = None
        self.opened = [r.opened for r in recs]
        self.where = [self.rindex[o.location] for o in objs]
        self.contents: list[set[int]] = [set() for _ in recs]
        for i, r in enumerate(self.where):
            self.contents[r].add(i)
        n = len(objs)
        self.clean = [False] * n
        self.hot = [False] * n
        self.cool = [False] * n
        self.sliced = [False] * n
        self.toggled = [False] * n
        # receptacles whose contents the agent has seen; objects only move by the agent's hand, so
        # what it has seen stays true: this is the expert's (and a careful agent's) knowledge
        self.observed = [False] * len(recs)
        self.steps = 0
        self.won = False
        self.last_observation = self.intro
        self._admissible: list[str] | None = None

    # ---- text -------------------------------------------------------------------------------
    def _visible(self, r: int) -> bool:
        return not self.ropenable[r] or self.opened[r]

    def _listing(self, r: int) -> str:
        names = [self.oname[i] for i in sorted(self.contents[r], key=self._list_key.__getitem__)]
        return W.join_items(names)

    def _describe(self, r: int) -> str:
        name = self.rname[r]
        if self.ropenable[r]:
            if self.opened[r]:
                return W.IN_OPEN.format(r=name, items=self._listing(r))
            return W.IS_CLOSED.format(r=name)
        return W.ON_TOP.format(r=name, items=self._listing(r))

    # ---- actions ----------------------------------------------------------------------------
    def admissible(self) -> list[str]:
        """The actions the engine would accept now, sorted as ALFWorld sorts them."""
        if self._admissible is not None:
            return self._admissible
        acts = ["help", "inventory", "look"]
        loc, held = self.loc, self.held
        acts += [g for i, g in enumerate(self.goto) if i != loc]
        if held is not None:
            acts.append(f"examine {self.oname[held]}")
        if loc is not None:
            rn, rt = self.rname[loc], self.rtype[loc]
            acts.append(f"examine {rn}")
            visible = self._visible(loc)
            if self.ropenable[loc]:
                acts.append(f"close {rn}" if self.opened[loc] else f"open {rn}")
            here = self.contents[loc]
            if held is None:
                if visible:
                    acts += [
                        f"take {self.oname[o]} from {rn}"
                        for o in here
                        if self.otype[o] not in NOT_PICKUPABLE
                    ]
            else:
                hn, ht = self.oname[held], self.otype[held]
                if visible and ht in CAN_CONTAIN[rt]:
                    acts.append(f"move {hn} to {rn}")
                if rt == "microwave" and ht in HEATABLE:
                    acts.append(f"heat {hn} with {rn}")
                elif rt == "fridge" and ht in COOLABLE:
                    acts.append(f"cool {hn} with {rn}")
                elif rt == "sinkbasin" and ht in CLEANABLE:
                    acts.append(f"clean {hn} with {rn}")
                if ht in SHARP:
                    # the engine lets a held knife slice what is here, even in a closed receptacle
                    acts += [
                        f"slice {self.oname[o]} with {hn}"
                        for o in here
                        if self.otype[o] in SLICEABLE
                    ]
            acts += [f"use {self.oname[o]}" for o in here if self.otype[o] in TOGGLEABLE]
        acts.sort()
        self._admissible = acts
        return acts

    def apply(self, action: str) -> tuple[str, bool]:
        """Apply one action; returns (observation, valid). Invalid actions change nothing."""
        text = W.normalize(action)
        self.steps += 1
        if text not in self.admissible():
            self.last_observation = W.NOTHING_HAPPENS
            return W.NOTHING_HAPPENS, False
        self._admissible = None
        obs = self._execute(text)
        self.won = self._check_won()
        self.last_observation = obs
        return obs, True

    def _execute(self, text: str) -> str:
        if text == "look":
            if self.loc is None:
                return W.LOOK_ROOM.format(items="nothing")
            return W.LOOK_AT.format(r=self.rname[self.loc])
        if text == "inventory":
            if self.held is None:
                return W.CARRYING_NOTHING
            return W.CARRYING.format(items=W.join_items([self.oname[self.held]]))
        if text == "help":
            return W.HELP
        p = W.parse_action(text)
        assert p is not None  # admissible actions always parse
        if p.verb == "go":
            r = self.rindex[p.target]
            self.loc = r
            if self._visible(r):
                self.observed[r] = True
            return W.ARRIVE.format(r=self.rname[r], contents=self._describe(r))
        if p.verb == "open":
            r = self.rindex[p.target]
            self.opened[r] = True
            self.observed[r] = True
            return W.OPENED.format(r=self.rname[r], contents=self._describe(r))
        if p.verb == "close":
            r = self.rindex[p.target]
            self.opened[r] = False
            return W.CLOSED.format(r=self.rname[r])
        if p.verb == "take":
            o, r = self.oindex[p.obj], self.rindex[p.target]
            self.contents[r].discard(o)
            self.where[o] = -1
            self.held = o
            return W.PICKED.format(o=self.oname[o], r=self.rname[r])
        if p.verb == "move":
            o, r = self.oindex[p.obj], self.rindex[p.target]
            self.contents[r].add(o)
            self.where[o] = r
            self.held = None
            return W.MOVED.format(o=self.oname[o], r=self.rname[r])
        if p.verb in _VERB_FEEDBACK:
            o, r = self.oindex[p.obj], self.rindex[p.target]
            if p.verb == "heat":
                self.hot[o], self.cool[o] = True, False
            elif p.verb == "cool":
                self.cool[o], self.hot[o] = True, False
            else:
                self.clean[o] = True
            return _VERB_FEEDBACK[p.verb].format(o=self.oname[o], r=self.rname[r])
        if p.verb == "slice":
            o = self.oindex[p.obj]
            self.sliced[o] = True
            return W.SLICED.format(o=self.oname[o], k=p.target)
        if p.verb == "use":
            o = self.oindex[p.obj]
            self.toggled[o] = True  # ALFWorld's toggle always reports "turn on" and stays toggled
            return W.TURNED_ON.format(o=self.oname[o])
        if p.verb == "examine":
            if p.target in self.rindex:
                r = self.rindex[p.target]
                if self._visible(r):
                    self.observed[r] = True
                return self._describe(r)
            o = self.oindex[p.target]
            return W.examine_object(
                self.oname[o],
                self.otype[o],
                clean=self.clean[o],
                hot=self.hot[o],
                cool=self.cool[o],
                sliced=self.sliced[o],
                receptacle_object=self.otype[o] in RECEPTACLE_OBJECTS,
            )
        raise AssertionError(f"unhandled admissible action {text!r}")

    # ---- goal -------------------------------------------------------------------------------
    def has_goal_state(self, o: int) -> bool:
        s = self.goal.state
        if s is None:
            return True
        return {"clean": self.clean, "heat": self.hot, "cool": self.cool}[s][o]

    def _check_won(self) -> bool:
        g = self.goal
        if g.task_type == "look_at_obj_in_light":
            if self.held is None or self.otype[self.held] != g.object_type or self.loc is None:
                return False
            return any(
                self.toggled[o] and self.otype[o] == g.toggle_type for o in self.contents[self.loc]
            )
        for r, here in enumerate(self.contents):
            if self.rtype[r] != g.receptacle_type:
                continue
            n = sum(1 for o in here if self.otype[o] == g.object_type and self.has_goal_state(o))
            if n >= g.count:
                return True
        return False


# ---- failure diagnosis --------------------------------------------------------------------------
def diagnose(game: SimGame, action: str) -> tuple[str, str, dict[str, str]]:
    """Why `action` was not admissible: (error_kind, hint_template_key, args for the hint text).

    `game` is a SimGame or any view with the same fields (the alfworld backend builds one from
    the engine's facts): rname, rindex, rtype, oname, oindex, otype, where, loc, held, _visible(r).
    """
    p = W.parse_action(action)
    if p is None:
        return "invalid_action", "household/invalid_action", {"action": action}
    if p.verb == "put":
        return (
            "invalid_action",
            "household/use_move",
            {"object": p.obj or "", "receptacle": p.target or ""},
        )
    rec = game.rindex.get(p.target) if p.target is not None else None
    obj = game.oindex.get(p.obj) if p.obj is not None else None
    here = game.rname[game.loc] if game.loc is not None else ""
    args = {"object": p.obj or "", "receptacle": p.target or "", "here": here}
    held_name = game.oname[game.held] if game.held is not None else ""
    args["held"] = held_name

    def at(r: int | None) -> bool:
        return r is not None and game.loc == r

    if p.verb == "go":
        if rec is None:
            return "unknown_receptacle", "household/unknown_receptacle", args
        return "already_here", "household/already_here", args
    if p.verb in ("open", "close", "examine") and rec is None:
        if p.verb == "examine" and p.target in game.oindex:
            return "not_holding", "household/take_first", {**args, "object": p.target}
        return "unknown_receptacle", "household/unknown_receptacle", args
    if p.verb in ("open", "close", "examine"):
        if not at(rec):
            return "not_at_receptacle", "household/go_to_first", args
        return "not_admissible", "household/not_admissible", args
    if p.verb == "take":
        if game.held is not None:
            return "hands_full", "household/hands_full", args
        if rec is None:
            return "unknown_receptacle", "household/unknown_receptacle", args
        if not at(rec):
            return "not_at_receptacle", "household/go_to_first", args
        if not game._visible(rec):
            return "receptacle_closed", "household/open_first", args
        if obj is None or game.where[obj] != rec:
            return "object_not_here", "household/object_not_here", args
        return "not_admissible", "household/not_admissible", args
    if p.verb in ("move", "heat", "clean", "cool"):
        if obj is None or game.held != obj:
            return "not_holding", "household/take_first", args
        if rec is None:
            return "unknown_receptacle", "household/unknown_receptacle", args
        if not at(rec):
            return "not_at_receptacle", "household/go_to_first", args
        if p.verb == "move":
            if not game._visible(rec):
                return "receptacle_closed", "household/open_first", args
            return "cannot_contain", "household/cannot_contain", args
        if game.rtype[rec] != APPLIANCE[p.verb]:
            return (
                "wrong_appliance",
                "household/wrong_appliance",
                {**args, "appliance": APPLIANCE[p.verb]},
            )
        return "cannot_process", "household/cannot_process", args
    if p.verb == "use":
        if obj is None or game.otype[obj] not in TOGGLEABLE:
            return "not_toggleable", "household/not_toggleable", args
        return "object_not_here", "household/object_not_here", {**args, "receptacle": ""}
    return "not_admissible", "household/not_admissible", args
