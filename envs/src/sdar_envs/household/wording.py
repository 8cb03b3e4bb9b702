"""ALFWorld 0.4.2's exact text: feedback templates, list joining, the help text, and action parsing.

Copied from the engine's grammar (game.tw-pddl) and checked by playing official games; both the
simulator and error diagnosis for the real engine use these so the two backends read the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NOTHING_HAPPENS = "Nothing happens."
INTRO = "-= Welcome to TextWorld, ALFRED! =-\n\n{look}\n\n{task}"
TASK_LINE = "Your task is to: {task}."
LOOK_ROOM = "You are in the middle of a room. Looking quickly around you, you see {items}."
LOOK_AT = "You are facing the {r}. Next to it, you see nothing."
ARRIVE = "You arrive at {r}. {contents}"
OPENED = "You open the {r}. {contents}"
CLOSED = "You close the {r}."
PICKED = "You pick up the {o} from the {r}."
MOVED = "You move the {o} to the {r}."
HEATED = "You heat the {o} using the {r}."
CLEANED = "You clean the {o} using the {r}."
COOLED = "You cool the {o} using the {r}."
SLICED = "You sliced the {o} with the {k}."
TURNED_ON = "You turn on the {o}."
CARRYING = "You are carrying: {items}."
CARRYING_NOTHING = "You are not carrying anything."
IN_OPEN = "The {r} is open. In it, you see {items}."
IS_CLOSED = "The {r} is closed."
ON_TOP = "On the {r}, you see {items}."
HELP = (
    "Available commands:\n"
    "  look:                             look around your current location\n"
    "  inventory:                        check your current inventory\n"
    "  go to (receptacle):               move to a receptacle\n"
    "  open (receptacle):                open a receptacle\n"
    "  close (receptacle):               close a receptacle\n"
    "  take (object) from (receptacle):  take an object from a receptacle\n"
    "  move (object) to (receptacle):  place an object in or on a receptacle\n"
    "  examine (something):              examine a receptacle or an object\n"
    "  use (object):                     use an object\n"
    "  heat (object) with (receptacle):  heat an object using a receptacle\n"
    "  clean (object) with (receptacle): clean an object using a receptacle\n"
    "  cool (object) with (receptacle):  cool an object using a receptacle\n"
    "  slice (object) with (object):     slice an object using a sharp object\n"
)


def join_items(names: list[str]) -> str:
    """ALFWorld's list: 'a x 1', 'a x 1, and a y 2', 'a x, a y, and a z'; 'nothing' when empty.

    The article is always 'a' (the engine writes "a egg 1").
    """
    if not names:
        return "nothing"
    items = [f"a {n}" for n in names]
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]


def examine_object(
    name: str,
    otype: str,
    *,
    clean: bool,
    hot: bool,
    cool: bool,
    sliced: bool,
    receptacle_object: bool,
) -> str:
    """The engine's `examine O` text for a held object (conditions in the grammar's order)."""
    if receptacle_object:
        return f"This is a normal {name}. In it, you see nothing."
    if sliced:
        if clean and hot:
            return f"This is a hot and clean sliced {name}."
        if clean and cool:
            return f"This is a cool and clean sliced {name}."
        if clean:
            return f"This is a clean sliced {name}."
        if hot:
            return f"This is a hot sliced {name}."
        if cool:
            return f"This is a cool sliced {name}."
    if clean and hot:
        return f"This is a hot and clean {name}."
    if clean and cool:
        return f"This is a cool and clean {name}."
    if hot:
        return f"This is a hot {name}."
    if clean:
        return f"This is a clean {name}."
    if cool:
        return f"This is a cold {name}."
    if sliced:
        return f"This is a sliced {name}."
    return f"There's nothing special about {name}."


# ---- parsing ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParsedAction:
    """An action split into its verb and arguments.

    verb: one of go, open, close, take, move, heat, clean, cool, slice, use, examine, inventory,
        look, help, or "put" (the pre-0.4 wording "put X in/on R", which ALFWorld 0.4.2 rejects).
    obj: the object argument (take/move/heat/clean/cool/slice/use/put), else None.
    target: the receptacle (for slice the sharp object; for go/open/close/examine the argument).
    """

    verb: str
    obj: str | None = None
    target: str | None = None


_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("go", re.compile(r"^go to (?P<target>.+)$")),
    ("open", re.compile(r"^open (?P<target>.+)$")),
    ("close", re.compile(r"^close (?P<target>.+)$")),
    ("take", re.compile(r"^take (?P<obj>.+?) from (?P<target>.+)$")),
    ("move", re.compile(r"^move (?P<obj>.+?) to (?P<target>.+)$")),
    ("put", re.compile(r"^put (?P<obj>.+?) (?:in|on|into|in/on) (?P<target>.+)$")),
    ("heat", re.compile(r"^heat (?P<obj>.+?) with (?P<target>.+)$")),
    ("clean", re.compile(r"^clean (?P<obj>.+?) with (?P<target>.+)$")),
    ("cool", re.compile(r"^cool (?P<obj>.+?) with (?P<target>.+)$")),
    ("slice", re.compile(r"^slice (?P<obj>.+?) with (?P<target>.+)$")),
    ("use", re.compile(r"^use (?P<obj>.+)$")),
    ("examine", re.compile(r"^examine (?P<target>.+)$")),
)
_BARE = {"inventory": "inventory", "look": "look", "help": "help"}
_SPACES = re.compile(r"\s+")


def normalize(action: str) -> str:
    """Lower-case, trim and collapse whitespace: the form admissible actions are compared in."""
    return _SPACES.sub(" ", action.strip().lower())


def parse_action(action: str) -> ParsedAction | None:
    """Split an action into verb and arguments; None when it matches no household command."""
    text = normalize(action)
    if text in _BARE:
        return ParsedAction(_BARE[text])
    for verb, pattern in _PATTERNS:
        m = pattern.match(text)
        if m:
            groups = m.groupdict()
            return ParsedAction(verb, groups.get("obj"), groups.get("target"))
    return None
