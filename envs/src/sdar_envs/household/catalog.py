"""Static household tables: receptacle and object types, what holds what, rooms (the location priors: priors.py).

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
