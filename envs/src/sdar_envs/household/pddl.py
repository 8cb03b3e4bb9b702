"""ALFWorld's PDDL written from a scene: a generated sim problem as a game the real engine plays (fidelity).
Reading the engine's facts and goal back (error diagnosis, the fast domain-recipe gold planner) is in
household/engine_plan.py."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdar_envs.household.backend import TASK_TYPES

# Types ALFWorld never marks `pickupable` (scenery and lamps), read off the 340 official games.
NOT_PICKUPABLE = frozenset(
    {
        "Bathtub", "Blinds", "Chair", "Curtains", "DeskLamp", "FloorLamp", "HousePlant", "LaundryHamperLid",
        "LightSwitch", "Mirror", "Painting", "Poster", "ShowerDoor", "ShowerGlass", "Sink", "StoveKnob",
        "Television", "Window",
    }
)  # fmt: skip


@dataclass
class SceneReceptacle:
    """A receptacle of the scene.

    name: display name with its number, e.g. "drawer 3" (numbers 1..n per type).
    openable: it has a door/lid (ALFWorld: cabinet, drawer, fridge, microwave, safe).
    opened: it starts open (official games start every openable receptacle closed).
    """

    name: str
    openable: bool = False
    opened: bool = False


@dataclass
class SceneObject:
    """A portable object (or a lamp) of the scene.

    name: display name with its number, e.g. "apple 2".
    receptacle: name of the receptacle it starts in/on.
    """

    name: str
    receptacle: str


@dataclass
class Scene:
    """A whole household problem, engine-neutral.

    task_type: one of TASK_TYPES. task_text: the goal sentence without the final '.'.
    goal_object / goal_receptacle / goal_toggle: type names (lower case, e.g. "apple",
    "countertop", "desklamp"); goal_receptacle is None for look_at_obj_in_light and
    goal_toggle None for the others.
    """

    task_type: str
    task_text: str
    receptacles: list[SceneReceptacle]
    objects: list[SceneObject]
    goal_object: str
    goal_receptacle: str | None = None
    goal_toggle: str | None = None
    name: str = "sim"
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# ALFWorld's tables
# ---------------------------------------------------------------------------------------
def _constants() -> Any:
    from alfworld.gen import constants

    return constants


def alfworld_domain() -> str:
    """The PDDL domain every official game embeds (alfworld/data/alfred.pddl)."""
    from alfworld.info import ALFRED_PDDL_PATH

    with open(ALFRED_PDDL_PATH) as fh:
        return fh.read()


def alfworld_grammar(task_text: str) -> str:
    """The game grammar with the goal filled in, as ALFWorld's `add_task_to_grammar` does."""
    from alfworld.info import ALFRED_TWL2_PATH

    with open(ALFRED_TWL2_PATH) as fh:
        grammar = fh.read()
    if "UNKNOWN GOAL" not in grammar:
        raise RuntimeError(
            f"{ALFRED_TWL2_PATH} has no 'UNKNOWN GOAL' slot; is this alfworld 0.4.2?"
        )
    return grammar.replace("UNKNOWN GOAL", task_text)


def alfworld_type(kind: str) -> str:
    """ALFWorld's CamelCase type of a lower-case kind ('countertop' -> 'CounterTop')."""
    table = _constants().OBJECTS_LOWER_TO_UPPER
    if kind not in table:
        raise ValueError(
            f"{kind!r} is not an ALFWorld object or receptacle type; known: {', '.join(sorted(table))}"
        )
    return table[kind]


def split_name(name: str) -> tuple[str, int]:
    """'drawer 3' -> ('drawer', 3)."""
    kind, _, num = name.strip().rpartition(" ")
    if not kind or not num.isdigit() or int(num) < 1:
        raise ValueError(
            f"entity name {name!r} is not '<type> <number>' with a number >= 1 (e.g. 'drawer 3')"
        )
    return kind, int(num)


# ---------------------------------------------------------------------------------------
# names the engine demangles back to the scene's names
# ---------------------------------------------------------------------------------------
def _coord(value: int) -> str:
    # ALFRED's mangled coordinates: '+01.25' -> '_plus_01_dot_25'
    return f"_plus_{value // 100:02d}_dot_{value % 100:02d}"


def mangled_ids(names: list[str], kind_of: dict[str, str]) -> dict[str, str]:
    """PDDL ids for entity names such that ALFWorld's Demangler gives the names back.

    The Demangler sorts the (lower-cased) ids of one type and numbers them n, n-1, ..., 1, so
    instance k of n gets the coordinate n-k. Basins follow ALFRED ('Sink_bar_..._bar_SinkBasin'),
    because the Demangler appends 'basin' when it sees one in the id.
    """
    by_kind: dict[str, list[int]] = {}
    for name in names:
        kind, num = split_name(name)
        by_kind.setdefault(kind, []).append(num)
    for kind, nums in by_kind.items():
        if sorted(nums) != list(range(1, len(nums) + 1)):
            raise ValueError(
                f"the {kind}s are numbered {sorted(nums)}; the engine numbers the instances of a type 1..n, "
                "so a scene must use exactly those numbers"
            )
    ids = {}
    for name in names:
        kind, num = split_name(name)
        n = len(by_kind[kind])
        camel = kind_of[name]
        coords = f"{_coord(n - num)}_bar_{_coord(0)}_bar_{_coord(0)}"
        if camel.endswith("Basin"):
            ids[name] = f"{camel[: -len('Basin')]}_bar_{coords}_bar_{camel}"
        else:
            ids[name] = f"{camel}_bar_{coords}"
    return ids


# ---------------------------------------------------------------------------------------
# the problem
# ---------------------------------------------------------------------------------------
def _goal(scene: Scene) -> str:
    obj = alfworld_type(scene.goal_object) + "Type"
    if scene.task_type == "look_at_obj_in_light":
        if not scene.goal_toggle:
            raise ValueError("a look_at_obj_in_light scene needs goal_toggle (e.g. 'desklamp')")
        lamp = alfworld_type(scene.goal_toggle) + "Type"
        return f"""(and
        (exists (?ot - object ?r - receptacle ?a - agent ?l - location)
            (and (objectType ?ot {lamp}) (toggleable ?ot) (isToggled ?ot)
                 (receptacleAtLocation ?r ?l) (atLocation ?a ?l) (inReceptacle ?ot ?r)))
        (exists (?o - object ?a - agent)
            (and (objectType ?o {obj}) (holds ?a ?o))))"""
    if not scene.goal_receptacle:
        raise ValueError(f"a {scene.task_type} scene needs goal_receptacle (e.g. 'countertop')")
    recep = alfworld_type(scene.goal_receptacle) + "Type"
    if scene.task_type == "pick_two_obj_and_place":
        return f"""(and (exists (?r - receptacle) (exists (?o1 - object)
        (and (objectType ?o1 {obj}) (receptacleType ?r {recep}) (inReceptacle ?o1 ?r)
             (exists (?o2 - object)
                 (and (not (= ?o1 ?o2)) (objectType ?o2 {obj}) (receptacleType ?r {recep})
                      (inReceptacle ?o2 ?r)))))))"""
    state = {
        "pick_and_place_simple": "",
        "pick_clean_then_place_in_recep": "(cleanable ?o) (isClean ?o)",
        "pick_heat_then_place_in_recep": "(heatable ?o) (isHot ?o)",
        "pick_cool_then_place_in_recep": "(coolable ?o) (isCool ?o)",
    }[scene.task_type]
    return f"""(and (exists (?r - receptacle) (exists (?o - object)
        (and (inReceptacle ?o ?r) (objectType ?o {obj}) (receptacleType ?r {recep}) {state}))))"""


def scene_to_pddl(scene: Scene) -> str:
    """The PDDL problem of `scene` in the shape of the official games' problems.

    Affordances (pickupable, cleanable, heatable, coolable, toggleable, isReceptacleObject,
    canContain) come from ALFWorld's tables, exactly as the official games have them; only the
    layout (what is where, what opens) comes from the scene. Each receptacle has its own
    location and the agent starts at a location with no receptacle, as in the official games.
    """
    if scene.task_type not in TASK_TYPES:
        raise ValueError(
            f"unknown task type {scene.task_type!r}; choose one of {', '.join(TASK_TYPES)}"
        )
    C = _constants()
    recep_names = [r.name for r in scene.receptacles]
    obj_names = [o.name for o in scene.objects]
    if len(set(recep_names + obj_names)) != len(recep_names) + len(obj_names):
        raise ValueError("scene entity names must be unique")
    kind_of = {n: alfworld_type(split_name(n)[0]) for n in recep_names + obj_names}
    for r in scene.receptacles:
        if kind_of[r.name] not in C.RECEPTACLES or kind_of[r.name] in C.MOVABLE_RECEPTACLES:
            raise ValueError(f"{r.name!r} is not an ALFWorld (static) receptacle type")
    holders = set(recep_names)
    for o in scene.objects:
        if o.receptacle not in holders:
            raise ValueError(
                f"object {o.name!r} starts in {o.receptacle!r}, which is not a receptacle of the scene"
            )
    ids = mangled_ids(recep_names + obj_names, kind_of)
    loc = {name: f"loc_bar_{i + 1}_bar_0_bar_0_bar_0" for i, name in enumerate(recep_names)}
    start = "loc_bar_0_bar_0_bar_0_bar_0"

    rtypes = sorted({kind_of[n] for n in recep_names} | {"SinkBasin", "Microwave", "Fridge"})
    otypes = sorted({kind_of[n] for n in obj_names} | {"Knife", "ButterKnife"})
    objects = ["agent1 - agent"]
    objects += [f"{t}Type - rtype" for t in rtypes]
    objects += [f"{t}Type - otype" for t in otypes]
    objects += [f"{ids[n]} - receptacle" for n in recep_names]
    objects += [f"{ids[n]} - object" for n in obj_names]
    objects += [f"{loc[n]} - location" for n in recep_names] + [f"{start} - location"]

    actions = C.VAL_ACTION_OBJECTS
    init = [f"(atLocation agent1 {start})"]
    for r in scene.receptacles:
        rid = ids[r.name]
        init.append(f"(receptacleType {rid} {kind_of[r.name]}Type)")
        init.append(f"(receptacleAtLocation {rid} {loc[r.name]})")
        if r.openable:
            init.append(f"(openable {rid})")
            if r.opened:
                init.append(f"(opened {rid})")
    present_otypes = {kind_of[n] for n in obj_names}
    for rt in sorted({kind_of[n] for n in recep_names}):
        for ot in sorted(C.VAL_RECEPTACLE_OBJECTS.get(rt, ()) & present_otypes):
            init.append(f"(canContain {rt}Type {ot}Type)")
    for o in scene.objects:
        oid, otype = ids[o.name], kind_of[o.name]
        init.append(f"(objectType {oid} {otype}Type)")
        init.append(f"(inReceptacle {oid} {ids[o.receptacle]})")
        init.append(f"(objectAtLocation {oid} {loc[o.receptacle]})")
        if otype not in NOT_PICKUPABLE:
            init.append(f"(pickupable {oid})")
        if otype in C.MOVABLE_RECEPTACLES:
            init.append(f"(isReceptacleObject {oid})")
        for pred, table in (
            ("cleanable", "Cleanable"),
            ("heatable", "Heatable"),
            ("coolable", "Coolable"),
            ("toggleable", "Toggleable"),
            ("sliceable", "Sliceable"),
        ):
            if otype in actions[table]:
                init.append(f"({pred} {oid})")

    problem_name = "".join(ch if ch.isalnum() else "_" for ch in scene.name) or "sim"
    body = "\n        ".join
    return (
        f"(define (problem plan_{problem_name})\n(:domain alfred)\n(:objects\n        {body(objects)}\n)\n"
        f"(:init\n        {body(init)}\n)\n(:goal {_goal(scene)}\n)\n)\n"
    )


def scene_game(scene: Scene) -> dict[str, Any]:
    """The game.tw-pddl content of `scene` (the official games' four keys)."""
    return {
        "pddl_domain": alfworld_domain(),
        "grammar": alfworld_grammar(scene.task_text),
        "pddl_problem": scene_to_pddl(scene),
        "solvable": True,
    }


def write_game(scene: Scene, out_dir: str | os.PathLike) -> Path:
    """Write `scene` as `<out_dir>/<task_type>-<Obj>-None-<Recep>-<name>/trial_<name>/game.tw-pddl`.

    The directory follows ALFWorld's layout, so the engine's loader reads the task type off it.
    """
    recep = alfworld_type(scene.goal_receptacle or scene.goal_toggle or scene.goal_object)
    safe = "".join(ch if ch.isalnum() else "_" for ch in scene.name)
    game_dir = (
        Path(out_dir)
        / f"{scene.task_type}-{alfworld_type(scene.goal_object)}-None-{recep}-{safe}"
        / f"trial_{safe}"
    )
    game_dir.mkdir(parents=True, exist_ok=True)
    path = game_dir / "game.tw-pddl"
    with open(path, "w") as fh:
        json.dump(scene_game(scene), fh)
    return path


def scene_from_sim(problem: Any) -> Scene:
    """The engine-neutral `Scene` of a `sim.SimProblem` (same names, layout, goal and wording)."""
    goal = problem.goal
    safe_id = "".join(ch if ch.isalnum() else "_" for ch in problem.task_id)
    return Scene(
        task_type=problem.task_type,
        task_text=problem.task_text,
        receptacles=[SceneReceptacle(r.name, r.openable, r.opened) for r in problem.receptacles],
        objects=[SceneObject(o.name, o.location) for o in problem.objects],
        goal_object=goal.object_type,
        goal_receptacle=goal.receptacle_type,
        goal_toggle=goal.toggle_type,
        name=safe_id,
        extra={"task_id": problem.task_id, "room": problem.room},
    )
