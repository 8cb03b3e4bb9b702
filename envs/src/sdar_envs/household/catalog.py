"""Static household tables: receptacle and object types, what holds what, rooms, location priors.

Taken from ALFWorld 0.4.2 (`alfworld.gen.constants`) and from counts over the 340 official
valid_seen + valid_train games, so the simulator's rooms and the privileged skills match ALFWorld.
Static data only: the household vocabulary and world knowledge the agent's memory, the rule expert and the search
use (code outside sdar_envs may import it too: sdar's replay server); the engines and the sim stay internal.
"""

from __future__ import annotations

from dataclasses import dataclass


def _names(words: str) -> frozenset[str]:
    return frozenset(words.split())


def _words(words: str) -> tuple[str, ...]:
    return tuple(words.split())


# ---- receptacles ------------------------------------------------------------------------------
# display name -> ALFWorld type name (the `...Type` in PDDL)
RECEPTACLE_TYPES: dict[str, str] = {
    "armchair": "ArmChair",
    "bathtubbasin": "BathtubBasin",
    "bed": "Bed",
    "cabinet": "Cabinet",
    "cart": "Cart",
    "coffeemachine": "CoffeeMachine",
    "coffeetable": "CoffeeTable",
    "countertop": "CounterTop",
    "desk": "Desk",
    "diningtable": "DiningTable",
    "drawer": "Drawer",
    "dresser": "Dresser",
    "fridge": "Fridge",
    "garbagecan": "GarbageCan",
    "handtowelholder": "HandTowelHolder",
    "laundryhamper": "LaundryHamper",
    "microwave": "Microwave",
    "ottoman": "Ottoman",
    "safe": "Safe",
    "shelf": "Shelf",
    "sidetable": "SideTable",
    "sinkbasin": "SinkBasin",
    "sofa": "Sofa",
    "stoveburner": "StoveBurner",
    "toaster": "Toaster",
    "toilet": "Toilet",
    "toiletpaperhanger": "ToiletPaperHanger",
    "towelholder": "TowelHolder",
    "tvstand": "TVStand",
}
OPENABLE = _names("cabinet drawer fridge microwave safe")
# the appliance each processing task type needs, and the verb of its action
APPLIANCE = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}

# ---- objects ----------------------------------------------------------------------------------
OBJECT_TYPES: dict[str, str] = {
    "alarmclock": "AlarmClock",
    "apple": "Apple",
    "book": "Book",
    "bowl": "Bowl",
    "box": "Box",
    "bread": "Bread",
    "butterknife": "ButterKnife",
    "candle": "Candle",
    "cd": "CD",
    "cellphone": "CellPhone",
    "cloth": "Cloth",
    "creditcard": "CreditCard",
    "cup": "Cup",
    "desklamp": "DeskLamp",
    "dishsponge": "DishSponge",
    "egg": "Egg",
    "fork": "Fork",
    "handtowel": "HandTowel",
    "kettle": "Kettle",
    "keychain": "KeyChain",
    "knife": "Knife",
    "ladle": "Ladle",
    "laptop": "Laptop",
    "lettuce": "Lettuce",
    "mug": "Mug",
    "newspaper": "Newspaper",
    "pan": "Pan",
    "pen": "Pen",
    "pencil": "Pencil",
    "peppershaker": "PepperShaker",
    "pillow": "Pillow",
    "plate": "Plate",
    "pot": "Pot",
    "potato": "Potato",
    "remotecontrol": "RemoteControl",
    "saltshaker": "SaltShaker",
    "soapbar": "SoapBar",
    "soapbottle": "SoapBottle",
    "spatula": "Spatula",
    "spoon": "Spoon",
    "spraybottle": "SprayBottle",
    "statue": "Statue",
    "tissuebox": "TissueBox",
    "toiletpaper": "ToiletPaper",
    "tomato": "Tomato",
    "towel": "Towel",
    "vase": "Vase",
    "watch": "Watch",
    "winebottle": "WineBottle",
}
# ALFWorld's VAL_ACTION_OBJECTS (unsliced types only)
HEATABLE = _names("apple bread cup egg mug plate potato tomato")
COOLABLE = _names("apple bowl bread cup egg lettuce mug pan plate pot potato tomato winebottle")
CLEANABLE = _names(
    "apple bowl butterknife cloth cup dishsponge egg fork kettle knife ladle lettuce mug pan plate "
    "pot potato soapbar spatula spoon tomato"
)
SLICEABLE = _names("apple bread egg lettuce potato tomato")
SHARP = _names("butterknife knife")
TOGGLEABLE = _names("desklamp")
NOT_PICKUPABLE = _names("desklamp")
# ALFWorld marks these `isReceptacleObject`; examining one prints "This is a normal X. In it, ..."
RECEPTACLE_OBJECTS = _names("bowl box cup mug pan plate pot")

# ALFWorld's VAL_RECEPTACLE_OBJECTS restricted to the types above: receptacle -> what it can hold.
_TABLETOP = _names(
    "alarmclock apple book bowl box bread butterknife candle cd cellphone cloth creditcard cup "
    "desklamp dishsponge egg fork handtowel kettle keychain knife ladle laptop lettuce mug "
    "newspaper pan pen pencil peppershaker plate pot potato remotecontrol saltshaker soapbar "
    "soapbottle spatula spoon spraybottle statue tissuebox toiletpaper tomato vase watch "
    "winebottle"
)
_SEAT = _names("book box cellphone cloth creditcard keychain laptop newspaper pillow remotecontrol")
_DESK = _names(
    "alarmclock book bowl box candle cd cellphone cloth creditcard cup desklamp keychain laptop "
    "mug newspaper pen pencil plate remotecontrol spraybottle statue tissuebox toiletpaper vase "
    "watch winebottle"
)
CAN_CONTAIN: dict[str, frozenset[str]] = {
    "armchair": _SEAT,
    "bathtubbasin": _names("cloth dishsponge handtowel soapbar"),
    "bed": _names("book cellphone laptop newspaper pillow"),
    "cabinet": _names(
        "book bowl box candle cd cloth cup dishsponge handtowel kettle ladle mug newspaper pan "
        "peppershaker plate pot saltshaker soapbar soapbottle spraybottle tissuebox toiletpaper "
        "vase winebottle"
    ),
    "cart": _names(
        "candle cloth dishsponge handtowel mug soapbar soapbottle spraybottle statue tissuebox "
        "toiletpaper vase"
    ),
    "coffeemachine": _names("mug"),
    "coffeetable": _TABLETOP,
    "countertop": _TABLETOP,
    "desk": _DESK | {"soapbottle"},
    "diningtable": _TABLETOP,
    "drawer": _names(
        "book butterknife candle cd cellphone cloth creditcard dishsponge fork handtowel keychain "
        "knife ladle newspaper pen pencil peppershaker remotecontrol saltshaker soapbar soapbottle "
        "spatula spoon spraybottle tissuebox toiletpaper watch"
    ),
    "dresser": _DESK,
    "fridge": _names("apple bowl bread cup egg lettuce mug pan plate pot potato tomato winebottle"),
    "garbagecan": _names(
        "apple bread cd cloth dishsponge egg handtowel lettuce newspaper pen pencil potato soapbar "
        "soapbottle spraybottle tissuebox toiletpaper tomato winebottle"
    ),
    "handtowelholder": _names("handtowel"),
    "laundryhamper": _names("cloth"),
    "microwave": _names("apple bowl bread cup egg mug plate potato tomato"),
    "ottoman": _SEAT | {"pillow"},
    "safe": _names("cd cellphone creditcard keychain statue vase watch"),
    "shelf": _names(
        "alarmclock book bowl box candle cd cellphone cloth creditcard cup desklamp dishsponge "
        "kettle keychain mug newspaper pen pencil peppershaker plate pot remotecontrol saltshaker "
        "soapbar soapbottle spraybottle statue tissuebox toiletpaper vase watch winebottle"
    ),
    "sidetable": _TABLETOP,
    "sinkbasin": _names(
        "apple bowl butterknife cloth cup dishsponge egg fork handtowel kettle knife ladle lettuce "
        "mug pan plate pot potato soapbar spatula spoon tomato"
    ),
    "sofa": _SEAT | {"pillow"},
    "stoveburner": _names("kettle pan pot"),
    "toaster": frozenset(),
    "toilet": _names(
        "candle cloth dishsponge handtowel newspaper soapbar soapbottle spraybottle tissuebox "
        "toiletpaper"
    ),
    "toiletpaperhanger": _names("toiletpaper"),
    "towelholder": _names("towel"),
    "tvstand": _names("tissuebox"),
}

# ---- location priors --------------------------------------------------------------------------
# Where each object type starts: share of its instances per receptacle type over the official games
# (top receptacles only). The generator draws initial locations from these, and the privileged
# skills quote them, so the teacher knows where things tend to be while the student must learn it.
LOCATION_PRIORS: dict[str, dict[str, float]] = {
    "alarmclock": {
        "desk": 0.31,
        "sidetable": 0.25,
        "dresser": 0.18,
        "shelf": 0.18,
        "diningtable": 0.07,
    },
    "apple": {
        "fridge": 0.24,
        "countertop": 0.23,
        "microwave": 0.14,
        "diningtable": 0.13,
        "garbagecan": 0.12,
        "sinkbasin": 0.12,
    },
    "book": {
        "bed": 0.38,
        "desk": 0.13,
        "sofa": 0.10,
        "drawer": 0.09,
        "diningtable": 0.07,
        "dresser": 0.07,
        "shelf": 0.05,
    },
    "bowl": {
        "cabinet": 0.29,
        "fridge": 0.20,
        "countertop": 0.17,
        "diningtable": 0.14,
        "desk": 0.07,
        "shelf": 0.05,
    },
    "box": {
        "diningtable": 0.29,
        "sofa": 0.24,
        "coffeetable": 0.17,
        "dresser": 0.12,
        "sidetable": 0.08,
        "shelf": 0.05,
    },
    "bread": {"countertop": 0.54, "diningtable": 0.30, "fridge": 0.14},
    "butterknife": {"countertop": 0.54, "diningtable": 0.31, "drawer": 0.09, "sinkbasin": 0.06},
    "candle": {"toilet": 0.28, "countertop": 0.24, "cabinet": 0.14, "shelf": 0.10, "drawer": 0.09},
    "cd": {
        "drawer": 0.29,
        "desk": 0.18,
        "dresser": 0.14,
        "sidetable": 0.13,
        "shelf": 0.08,
        "garbagecan": 0.08,
    },
    "cellphone": {
        "bed": 0.23,
        "drawer": 0.22,
        "desk": 0.12,
        "dresser": 0.10,
        "sidetable": 0.07,
        "sofa": 0.05,
    },
    "cloth": {
        "bathtubbasin": 0.27,
        "cabinet": 0.25,
        "countertop": 0.14,
        "drawer": 0.12,
        "sinkbasin": 0.09,
        "shelf": 0.07,
    },
    "creditcard": {
        "drawer": 0.27,
        "sidetable": 0.14,
        "shelf": 0.10,
        "dresser": 0.08,
        "coffeetable": 0.08,
        "armchair": 0.08,
    },
    "cup": {
        "cabinet": 0.23,
        "countertop": 0.21,
        "fridge": 0.19,
        "diningtable": 0.14,
        "sinkbasin": 0.11,
        "microwave": 0.07,
    },
    "desklamp": {"sidetable": 0.44, "desk": 0.31, "dresser": 0.19, "shelf": 0.04},
    "dishsponge": {
        "countertop": 0.26,
        "cabinet": 0.25,
        "diningtable": 0.17,
        "drawer": 0.13,
        "sinkbasin": 0.07,
        "garbagecan": 0.05,
    },
    "egg": {
        "fridge": 0.25,
        "countertop": 0.23,
        "sinkbasin": 0.14,
        "garbagecan": 0.14,
        "microwave": 0.12,
        "diningtable": 0.12,
    },
    "fork": {"countertop": 0.47, "diningtable": 0.25, "drawer": 0.18, "sinkbasin": 0.08},
    "handtowel": {"handtowelholder": 0.92, "countertop": 0.08},
    "kettle": {"stoveburner": 0.38, "countertop": 0.33, "cabinet": 0.21, "diningtable": 0.07},
    "keychain": {
        "drawer": 0.20,
        "desk": 0.12,
        "sidetable": 0.11,
        "dresser": 0.11,
        "shelf": 0.09,
        "diningtable": 0.09,
        "safe": 0.05,
    },
    "knife": {"countertop": 0.55, "diningtable": 0.24, "drawer": 0.18, "sinkbasin": 0.03},
    "ladle": {"countertop": 0.50, "drawer": 0.18, "cabinet": 0.16, "diningtable": 0.15},
    "laptop": {
        "bed": 0.44,
        "diningtable": 0.13,
        "sofa": 0.11,
        "desk": 0.10,
        "armchair": 0.06,
        "coffeetable": 0.06,
    },
    "lettuce": {"countertop": 0.40, "diningtable": 0.32, "fridge": 0.23, "sinkbasin": 0.04},
    "mug": {
        "countertop": 0.22,
        "coffeemachine": 0.14,
        "cabinet": 0.13,
        "fridge": 0.12,
        "diningtable": 0.11,
        "desk": 0.08,
        "sinkbasin": 0.07,
        "shelf": 0.05,
    },
    "newspaper": {
        "sofa": 0.29,
        "diningtable": 0.18,
        "coffeetable": 0.14,
        "sidetable": 0.10,
        "shelf": 0.10,
        "armchair": 0.08,
    },
    "pan": {
        "stoveburner": 0.56,
        "countertop": 0.30,
        "cabinet": 0.06,
        "diningtable": 0.05,
        "fridge": 0.03,
    },
    "pen": {
        "desk": 0.22,
        "diningtable": 0.15,
        "sidetable": 0.14,
        "dresser": 0.14,
        "drawer": 0.12,
        "shelf": 0.10,
    },
    "pencil": {
        "drawer": 0.20,
        "sidetable": 0.17,
        "desk": 0.16,
        "dresser": 0.12,
        "diningtable": 0.10,
        "shelf": 0.09,
    },
    "peppershaker": {
        "countertop": 0.32,
        "cabinet": 0.29,
        "drawer": 0.18,
        "diningtable": 0.14,
        "shelf": 0.05,
    },
    "pillow": {"bed": 0.67, "sofa": 0.28, "armchair": 0.05},
    "plate": {
        "cabinet": 0.38,
        "countertop": 0.24,
        "diningtable": 0.20,
        "fridge": 0.08,
        "shelf": 0.04,
    },
    "pot": {
        "stoveburner": 0.75,
        "countertop": 0.12,
        "fridge": 0.05,
        "diningtable": 0.05,
        "cabinet": 0.02,
    },
    "potato": {
        "countertop": 0.33,
        "fridge": 0.23,
        "diningtable": 0.14,
        "microwave": 0.12,
        "sinkbasin": 0.09,
        "garbagecan": 0.07,
    },
    "remotecontrol": {
        "sofa": 0.21,
        "coffeetable": 0.17,
        "armchair": 0.11,
        "dresser": 0.10,
        "drawer": 0.10,
        "sidetable": 0.08,
    },
    "saltshaker": {
        "cabinet": 0.33,
        "countertop": 0.25,
        "diningtable": 0.19,
        "drawer": 0.18,
        "shelf": 0.04,
    },
    "soapbar": {
        "countertop": 0.27,
        "sinkbasin": 0.17,
        "toilet": 0.15,
        "cabinet": 0.10,
        "shelf": 0.09,
        "drawer": 0.08,
        "bathtubbasin": 0.05,
    },
    "soapbottle": {
        "countertop": 0.30,
        "cabinet": 0.27,
        "diningtable": 0.15,
        "garbagecan": 0.11,
        "toilet": 0.08,
        "shelf": 0.05,
    },
    "spatula": {"countertop": 0.47, "diningtable": 0.26, "drawer": 0.20, "sinkbasin": 0.07},
    "spoon": {"countertop": 0.34, "drawer": 0.28, "diningtable": 0.21, "sinkbasin": 0.15},
    "spraybottle": {
        "countertop": 0.29,
        "cabinet": 0.20,
        "toilet": 0.19,
        "garbagecan": 0.09,
        "shelf": 0.06,
        "cart": 0.05,
    },
    "statue": {
        "shelf": 0.28,
        "diningtable": 0.18,
        "countertop": 0.16,
        "sidetable": 0.15,
        "coffeetable": 0.13,
        "dresser": 0.05,
    },
    "tissuebox": {
        "sidetable": 0.19,
        "shelf": 0.17,
        "diningtable": 0.16,
        "coffeetable": 0.10,
        "countertop": 0.10,
        "desk": 0.09,
    },
    "toiletpaper": {
        "toilet": 0.24,
        "cabinet": 0.20,
        "countertop": 0.15,
        "toiletpaperhanger": 0.13,
        "shelf": 0.09,
        "garbagecan": 0.09,
    },
    "tomato": {
        "countertop": 0.34,
        "fridge": 0.31,
        "diningtable": 0.18,
        "garbagecan": 0.09,
        "sinkbasin": 0.07,
    },
    "towel": {"towelholder": 1.0},
    "vase": {
        "shelf": 0.41,
        "countertop": 0.18,
        "cabinet": 0.14,
        "diningtable": 0.08,
        "sidetable": 0.04,
    },
    "watch": {
        "coffeetable": 0.24,
        "sidetable": 0.17,
        "diningtable": 0.17,
        "dresser": 0.12,
        "drawer": 0.10,
        "safe": 0.05,
    },
    "winebottle": {
        "countertop": 0.30,
        "diningtable": 0.27,
        "cabinet": 0.24,
        "garbagecan": 0.12,
        "shelf": 0.05,
        "fridge": 0.02,
    },
}


# ---- rooms ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoomSpec:
    """One room kind (ALFWorld scenes: 1-30 kitchens, 201-230 living rooms, 301-330 bedrooms,
    401-430 bathrooms).

    always: receptacle types every room of this kind has (one each).
    fill: receptacle type -> (weight, max count) used to grow the room to its size.
    objects: object types that appear in this room (targets and distractors).
    """

    name: str
    always: tuple[str, ...]
    fill: dict[str, tuple[float, int]]
    objects: tuple[str, ...]


ROOMS: dict[str, RoomSpec] = {
    "kitchen": RoomSpec(
        "kitchen",
        always=("countertop", "cabinet", "fridge", "microwave", "sinkbasin"),
        fill={
            "cabinet": (6.0, 12),
            "drawer": (4.0, 6),
            "stoveburner": (2.0, 4),
            "countertop": (1.0, 3),
            "diningtable": (2.0, 2),
            "coffeemachine": (1.0, 1),
            "garbagecan": (1.0, 1),
            "toaster": (1.0, 1),
            "shelf": (0.7, 3),
        },
        objects=_words(
            "apple bowl bread butterknife cup dishsponge egg fork kettle knife ladle lettuce mug "
            "pan peppershaker plate pot potato saltshaker soapbottle spatula spoon tomato "
            "winebottle"
        ),
    ),
    "bathroom": RoomSpec(
        "bathroom",
        always=("countertop", "sinkbasin", "toilet"),
        fill={
            "cabinet": (2.5, 4),
            "drawer": (2.0, 6),
            "handtowelholder": (1.5, 2),
            "towelholder": (1.3, 2),
            "garbagecan": (1.0, 1),
            "toiletpaperhanger": (1.0, 1),
            "bathtubbasin": (0.6, 1),
            "shelf": (0.6, 3),
            "sinkbasin": (0.5, 2),
            "cart": (0.3, 1),
        },
        objects=_words(
            "candle cloth dishsponge handtowel soapbar soapbottle spraybottle toiletpaper towel"
        ),
    ),
    "bedroom": RoomSpec(
        "bedroom",
        always=("bed", "desk", "drawer"),
        fill={
            "drawer": (5.0, 8),
            "shelf": (2.3, 4),
            "sidetable": (1.2, 2),
            "dresser": (0.8, 1),
            "garbagecan": (1.0, 1),
            "armchair": (0.5, 1),
            "safe": (0.4, 1),
            "laundryhamper": (0.2, 1),
            "bed": (0.3, 2),
            "cabinet": (0.3, 2),
        },
        objects=_words(
            "alarmclock book bowl cd cellphone creditcard keychain laptop mug pen pencil pillow"
        ),
    ),
    "livingroom": RoomSpec(
        "livingroom",
        always=("sofa", "sidetable", "coffeetable"),
        fill={
            "drawer": (4.0, 6),
            "shelf": (2.9, 4),
            "sidetable": (1.5, 2),
            "armchair": (1.5, 2),
            "garbagecan": (1.0, 1),
            "diningtable": (0.6, 1),
            "tvstand": (0.4, 1),
            "cabinet": (0.4, 2),
            "dresser": (0.4, 1),
            "ottoman": (0.3, 1),
        },
        objects=_words(
            "box cellphone creditcard keychain laptop newspaper pillow remotecontrol statue "
            "tissuebox vase watch"
        ),
    ),
}

# rooms each task type is generated in (heat/cool need a kitchen, light a bed or living room)
TASK_ROOMS: dict[str, tuple[str, ...]] = {
    "pick_and_place_simple": ("kitchen", "bathroom", "bedroom", "livingroom"),
    "look_at_obj_in_light": ("bedroom", "livingroom"),
    "pick_clean_then_place_in_recep": ("kitchen", "bathroom"),
    "pick_heat_then_place_in_recep": ("kitchen",),
    "pick_cool_then_place_in_recep": ("kitchen",),
    "pick_two_obj_and_place": ("kitchen", "bathroom", "bedroom", "livingroom"),
}
# the state a processing task type requires of its object
TASK_STATE: dict[str, str | None] = {
    "pick_and_place_simple": None,
    "look_at_obj_in_light": None,
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": None,
}
# ALFWorld's goal templates (alfworld.gen.goal_library); one is drawn per task
TASK_TEMPLATES: dict[str, tuple[str, ...]] = {
    "pick_and_place_simple": ("put a {obj} in {recep}", "put some {obj} on {recep}"),
    "look_at_obj_in_light": (
        "look at {obj} under the {toggle}",
        "examine the {obj} with the {toggle}",
    ),
    "pick_clean_then_place_in_recep": (
        "put a clean {obj} in {recep}",
        "clean some {obj} and put it in {recep}",
    ),
    "pick_heat_then_place_in_recep": (
        "put a hot {obj} in {recep}",
        "heat some {obj} and put it in {recep}",
    ),
    "pick_cool_then_place_in_recep": (
        "put a cool {obj} in {recep}",
        "cool some {obj} and put it in {recep}",
    ),
    "pick_two_obj_and_place": (
        "put two {obj} in {recep}",
        "find two {obj} and put them in {recep}",
    ),
}
# objects ALFWorld's look_at_obj_in_light games ask for
LIGHT_TARGETS = _names(
    "alarmclock book bowl box cd cellphone creditcard keychain laptop mug newspaper pen pencil "
    "pillow remotecontrol statue tissuebox vase watch"
)
LAMP_HOLDERS = ("sidetable", "desk", "dresser")


def state_ok(task_state: str | None, otype: str) -> bool:
    """Whether objects of `otype` can take the state a task type requires."""
    if task_state is None:
        return True
    return otype in {"clean": CLEANABLE, "heat": HEATABLE, "cool": COOLABLE}[task_state]


def priors_for(otype: str, present: set[str] | frozenset[str] | None = None) -> dict[str, float]:
    """The location prior of `otype`, renormalised over the types `present` (all when None)."""
    table = {r: w for r, w in LOCATION_PRIORS[otype].items() if otype in CAN_CONTAIN[r]}
    if present is not None:
        table = {r: w for r, w in table.items() if r in present}
    total = sum(table.values())
    return {r: w / total for r, w in table.items()} if total > 0 else {}
