"""Observation-only rule experts, one per family, served as teachers for N-teacher trace replay.

Each reads only the chat messages the agent saw (task, recent turns, observation, admissible list,
household memory) and answers in the family's canonical format; never the environment's state.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from sdar.agent.memory import HouseholdMemory
from sdar.agent.parsing import format_action
from sdar.agent.prompts import TurnView
from sdar_envs.household.catalog import (
    APPLIANCE,
    CAN_CONTAIN,
    LOCATION_PRIORS,
    OBJECT_TYPES,
    OPENABLE,
    RECEPTACLE_TYPES,
    TOGGLEABLE,
)

# "default" and "b" differ in a few decisions each (household: the search order and tie-breaks; shop:
# the query; searchqa: the wording of some searches), so a pool of both agrees on most turns (77-85%
# of an expert's own turns) and disagrees on some
EXPERT_VARIANTS: tuple[str, ...] = ("default", "b")
Expert = Callable[[list[dict[str, str]]], str]


def rule_expert(family: str, variant: str = "default") -> Expert:
    """The rule expert of `family`: messages (as `PromptBuilder.messages` builds them, possibly with
    the privileged text in the user message) -> the response, `format_action(family, action)`."""
    if family not in _POLICIES:
        raise ValueError(f"no rule expert for family {family!r}; choose one of {', '.join(_POLICIES)}")
    if variant not in EXPERT_VARIANTS:
        raise ValueError(f"unknown rule-expert variant {variant!r}; choose one of {', '.join(EXPERT_VARIANTS)}")
    policy = _POLICIES[family]

    def expert(messages: list[dict[str, str]]) -> str:
        return format_action(family, policy(read_turn(messages, family), variant))

    expert.__name__ = f"{family}_rule_expert_{variant}"
    return expert


# ---- reading the prompt back ------------------------------------------------------------------
_HEADER = re.compile(r"(?m)^Task: (?P<task>.*)\nStep (?P<step>\d+) of (?P<max>\d+)\.$")
_SHOP_ACTION = re.compile(r"(?:search|click)\[[^\]]*\]")


def read_turn(messages: list[dict[str, str]], family: str) -> TurnView:
    """The `TurnView` a user message was rendered from (`PromptBuilder.user_text` read backwards);
    a privileged prefix is skipped. Observations may span lines; actions are one line each."""
    content = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    user = content if isinstance(content, str) else ""
    heads = list(_HEADER.finditer(user))
    if not heads:
        raise ValueError("the user message has no 'Task: ...' / 'Step k of N.' header; "
                         "build it with sdar.agent.prompts.PromptBuilder")
    head = heads[-1]
    body = user[head.end():]
    cut = body.rfind("\nNow: ")
    if cut < 0:
        raise ValueError("the user message has no 'Now: <observation>' line")
    recent, now = body[:cut], body[cut + len("\nNow: "):]
    memory = ""
    if family == "household":
        at = now.rfind("\nSeen: ")
        if at >= 0:
            now, memory = now[:at], now[at + 1:]
    admissible: list[str] = []
    at = now.rfind("\nAdmissible actions: ")
    if at >= 0:
        listed = now[at + len("\nAdmissible actions: "):].split("\n", 1)[0]
        now = now[:at]
        # shop options never hold ", " today, but the bracket pattern does not rely on it
        admissible = _SHOP_ACTION.findall(listed) if family == "shop" else listed.split(", ")
    history: list[tuple[str, str]] = []
    for chunk in re.split(r"\nObservation: ", recent)[1:]:
        obs, _, act = chunk.rpartition("\nAction: ")
        history.append((obs, act.strip()))
    return TurnView(task=head["task"], step=int(head["step"]) - 1, max_steps=int(head["max"]),
                    observation=now, admissible_actions=admissible, history=history, memory=memory)


# ---- household --------------------------------------------------------------------------------
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


def _kind(name: str) -> str:
    kind, _, num = name.rpartition(" ")
    return kind if num.isdigit() else name


def _order(name: str) -> tuple[str, int]:
    kind, _, num = name.rpartition(" ")
    return (kind, int(num)) if num.isdigit() else (name, 0)


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
        return self.seen[r] is not None if r in self.seen else _kind(r) not in OPENABLE

    def reach(self, r: str) -> str | None:
        """The step that puts `r` in front of the agent, open; None when it already is."""
        if self.loc != r:
            return f"go to {r}"
        return None if self.visible(r) else f"open {r}"


def _items(text: str) -> list[str] | None:
    if text == "closed":
        return None
    return [] if text == "nothing" else text.split(", ")


def _read_room(view: TurnView) -> _Room:
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
        room = sorted(set(seen) | set(todo), key=_order)
        k = _Room(room, seen, holding, state)
    else:  # no memory: what the recent window shows, plus the admissible list
        mem = HouseholdMemory(view.task, next_place=False)
        for obs in observations:
            mem.update(obs)
        k = _Room(list(mem.room), dict(mem.seen), mem.holding, remembered=False)
        goes = [a[len("go to "):] for a in view.admissible_actions if a.startswith("go to ")]
        examined = [a[len("examine "):] for a in view.admissible_actions if a.startswith("examine ")]
        here = [x for x in examined if _kind(x) in RECEPTACLE_TYPES]
        k.room = sorted(set(k.room) | set(goes) | set(here) | set(k.seen), key=_order)
        held = [x for x in examined if _kind(x) not in RECEPTACLE_TYPES]
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


def _household(view: TurnView, variant: str) -> str:
    goal = _Goal.parse(view.task)
    k = _read_room(view)
    action = _household_step(goal, k, variant) if k.loc_known else "look"  # "look" says where it is
    if view.admissible_actions and action not in view.admissible_actions:
        return "look"
    return action


def _household_step(goal: _Goal, k: _Room, variant: str) -> str:
    rank = _order if variant == "default" else (lambda r: (_kind(r), -_order(r)[1]))
    if k.holding is not None:
        if _kind(k.holding) != goal.obj:
            return _drop(k)
        if goal.lamp:
            lamps = [(o, r) for r, items in k.seen.items() for o in items or [] if _kind(o) in TOGGLEABLE]
            if not lamps:
                return _search(k, "desklamp", None, variant)
            o, r = min(lamps, key=lambda x: (x[1] != k.loc, rank(x[1])))
            return f"go to {r}" if k.loc != r else f"use {o}"
        if goal.state and k.state != goal.state:
            verb = _VERB_OF[goal.state]
            apps = [r for r in k.room if _kind(r) == APPLIANCE[verb]]
            if not apps:
                return "look"
            app = k.loc if k.loc in apps else apps[0]
            return f"go to {app}" if k.loc != app else f"{verb} {k.holding} with {app}"
        dests = [r for r in k.room if _kind(r) == goal.dest]
        if not dests:
            return "look"

        def fill(r: str) -> tuple[int, bool, bool, tuple[str, int]]:
            done = sum(1 for o in k.seen.get(r) or [] if _kind(o) == goal.obj)
            return (-done, r != k.loc, not k.visible(r), rank(r))

        dest = min(dests, key=fill)
        return k.reach(dest) or f"move {k.holding} to {dest}"
    found = [(o, r) for r, items in k.seen.items() if r not in k.closed and (goal.lamp or _kind(r) != goal.dest)
             for o in items or [] if _kind(o) == goal.obj]
    if found:
        o, r = min(found, key=lambda x: (x[1] != k.loc, not k.visible(x[1]), rank(x[1])))
        return k.reach(r) or f"take {o} from {r}"
    return _search(k, goal.obj, goal.dest, variant)


def _search(k: _Room, otype: str, skip: str | None, variant: str) -> str:
    """Next step of a search for `otype`, likeliest receptacle first (location priors: what anyone
    knows about where apples are, not this room's layout). default: by prior, then type and number;
    b: by prior per step (a closed receptacle costs an extra "open"), then type and number descending."""
    prior = LOCATION_PRIORS.get(otype, {})

    def key(r: str) -> tuple:
        p = prior.get(_kind(r), 0.0)
        if variant == "default":
            return (-p, _order(r))
        cost = 1 if r == k.loc else 1 + (_kind(r) in OPENABLE and not k.visible(r))
        return (-p / cost, _kind(r), -_order(r)[1])

    holds = sorted((r for r in k.room if otype in CAN_CONTAIN.get(_kind(r), ()) and _kind(r) != skip), key=key)
    todo = [r for r in holds if k.seen.get(r) is None or r in k.closed]
    if not todo:  # nowhere likely is left: anywhere not yet seen
        holds = sorted(k.room, key=key)
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
    if k.loc and k.visible(k.loc) and _kind(held) in CAN_CONTAIN.get(_kind(k.loc), ()):
        return f"move {held} to {k.loc}"
    holders = [r for r in k.room if _kind(held) in CAN_CONTAIN.get(_kind(r), ())]
    if not holders:
        return "look"
    r = min(holders, key=lambda r: (not k.visible(r), _order(r)))
    return k.reach(r) or f"move {held} to {r}"


# ---- shop -------------------------------------------------------------------------------------
_SEP = " [SEP] "
_PRICE = re.compile(r",? and price lower than (?P<p>[\d.]+) dollars")
_OPTIONS = re.compile(r" with (?=[a-z]+: )")
_RESULT = re.compile(r"^(?:B0[A-Z0-9]{8}|item \d+)$")  # a result's id, or its rank handle (ShopConfig.result_handles)
_PHRASE = re.compile(r",\s*|\s+(?:and|that is|that are|with|for)\s+")  # between attribute phrases
# words that carry no product meaning in an instruction (the request wording and glue words)
_SHOP_STOP = frozenset(
    "i i'm im am need want to buy find me searching looking for would like a an some the that is are and "
    "with of in it its on".split())


@dataclass
class _Want:
    """The instruction: its product words, attribute phrases, option values and price ceiling."""

    words: list[str]
    phrases: list[list[str]]  # "keto friendly and individually wrapped beef jerky" -> [keto friendly], [...]
    options: list[str]
    ceiling: float

    @classmethod
    def parse(cls, text: str) -> _Want:
        text = text.lower().strip()
        m = _PRICE.search(text)
        ceiling = float(m["p"]) if m else float("inf")
        text = text[:m.start()] if m else text
        head, *rest = _OPTIONS.split(text, maxsplit=1)
        options = [o.split(": ", 1)[1].strip() for o in rest[0].split(", and ")] if rest else []
        phrases = [p for p in (_words(x) for x in _PHRASE.split(head)) if p]
        return cls(_words(head), phrases, options, ceiling)

    def fits(self, title: str, details: list[str]) -> bool:
        """Whether every attribute phrase is stated by the title or the product's detail pages; a
        phrase that ends in the product's noun ("individually wrapped beef jerky") counts without it."""
        text, named = _words(" ".join([title, *details])), set(_words(title))
        for phrase in self.phrases:
            while phrase and not _contains(text, phrase) and phrase[-1] in named:
                phrase = phrase[:-1]
            if phrase and not _contains(text, phrase):
                return False
        return True


def _words(text: str) -> list[str]:
    """Content words, plurals folded."""
    out = []
    for w in re.findall(r"[a-z0-9'.-]+", text.lower()):
        w = w.strip(".")
        if w and w not in _SHOP_STOP:
            out.append(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def _contains(text: list[str], phrase: list[str]) -> bool:
    n = len(phrase)
    return any(text[i:i + n] == phrase for i in range(len(text) - n + 1))


def _page(obs: str) -> str:
    if obs.startswith("WebShop [SEP]"):
        return "search"
    if obs.startswith("Thank you for shopping"):
        return "done"
    if re.search(r"\[SEP\] Page \d+ \(Total results: \d+\)", obs):
        return "results"
    return "item" if obs.endswith("[SEP] Buy Now") else "sub"


def _details(obs: str) -> str:
    """What a Description / Features / Reviews page says (the instruction it repeats left out)."""
    segs = obs.split(_SEP)
    return " ".join(segs[segs.index("< Prev") + 1:]) if "< Prev" in segs else ""


def _item(obs: str) -> tuple[str, float, list[str]]:
    """(title, price, option segments) of an item page."""
    segs = obs.split(_SEP)
    at = next(i for i, s in enumerate(segs) if s.startswith("Price: "))
    prev = segs.index("< Prev")
    price = float(re.sub(r"[^\d.]", "", segs[at]) or 0)
    return segs[at - 1], price, [s.lower() for s in segs[prev + 1:at - 1]]


def _shop(view: TurnView, variant: str) -> str:
    want = _Want.parse(view.task)
    page = _page(view.observation)
    if page == "search":
        if variant == "default":
            return f"search[{' '.join(want.words)}]"
        return f"search[{' '.join(want.words + want.options)}]"
    if page == "done":
        return "click[back to search]"
    if page == "sub":
        return "click[< prev]"
    if page == "results":
        return _shop_results(view, want)
    if view.max_steps - view.step <= 1:
        return "click[buy now]"  # the last step: a partial score beats none
    return _shop_item(view, want)


def _shop_results(view: TurnView, want: _Want) -> str:
    segs = view.observation.split(_SEP)
    rows = [(segs[i], segs[i + 1], float(re.sub(r"[^\d.]", "", segs[i + 2]) or 0))
            for i in range(len(segs) - 2) if _RESULT.match(segs[i])]
    # the engine's order (it matches the query against descriptions and options too, which the titles
    # shown here do not carry) beats re-ranking by title overlap (100% vs 91% on 100 test goals)
    ranked = [i for i in range(len(rows)) if rows[i][2] <= want.ceiling]
    # products backed out of in the window: go on after the latest one (the ranking is fixed, so
    # the sweep needs no memory beyond the window)
    left = [_item(o)[0] for o, a in view.history if _page(o) == "item" and a in ("click[< prev]",
                                                                                  "click[back to search]")]
    titles = [rows[i][1] for i in ranked]
    if left and left[-1] in titles:
        ranked = ranked[titles.index(left[-1]) + 1:]
    ranked = [i for i in ranked if rows[i][1] not in left]
    if ranked:
        return f"click[{rows[ranked[0]][0].lower()}]"
    return "click[next >]" if "Next >" in segs else "click[back to search]"


def _shop_item(view: TurnView, want: _Want) -> str:
    title, price, options = _item(view.observation)
    if price > want.ceiling or any(v not in options for v in want.options):
        return "click[< prev]"
    # this product's turns: those since the results page it was opened from
    pages = [_page(o) for o, _ in view.history]
    since = max((i + 1 for i, p in enumerate(pages) if p in ("search", "results")), default=0)
    mine = view.history[since:]
    clicked = {a[len("click["):-1] for _, a in mine if a.startswith("click[")}
    # options are chosen only once the product looks right, so a chosen one means it was checked
    checked = any(v in clicked for v in want.options)
    details = [_details(o) for o, _ in mine if _page(o) == "sub"]
    if not checked and not want.fits(title, details):
        return "click[< prev]" if details else "click[description]"
    for v in want.options:
        if v not in clicked:
            return f"click[{v}]"
    return "click[buy now]"


# ---- search QA --------------------------------------------------------------------------------
_NAME = r"[A-Z][\w'-]*(?:(?: of| and the| the| de)? [A-Z][\w'-]*)*"
_DOC = re.compile(r"Doc \d+\(Title: (?P<title>.*?)\) (?P<text>.*)")
_KINDS = "novel|poetry collection|opera|painting|film"


@dataclass(frozen=True)
class _Fact:
    """A fact about a subject: how to ask for it (default, b) and where a passage states it.

    own: regexes over the subject's own article (passage title == subject), group 1 the value.
    other: regexes over any passage naming the subject ({s}); the value is group 1, or the
        passage's title when the pattern has no group ("X is the current head of state of {s}").
    """

    query: str
    query_b: str
    own: tuple[str, ...]
    other: tuple[str, ...] = ()


_FACTS: dict[str, _Fact] = {
    "capital": _Fact("capital of {s}", "{s} capital city", (
        rf"capital and largest city is ({_NAME})", rf"The capital of {{s}} is ({_NAME})"),
        (rf"({_NAME}) is the capital and largest city of {{s}}\b",)),
    "currency": _Fact("{s} currency", "currency of {s}", (r"currency is the ([\w ]+?)\.",)),
    "head": _Fact("{s} head of state", "head of state of {s}", (
        rf"head of state is ({_NAME})\.", rf"has been led by ({_NAME})\."),
        (r"is the current head of state of {s}\b",)),
    "country_of_city": _Fact("{s} city country", "{s} city", (
        rf"^{{s}} is (?:a city|a town|the capital and largest city) (?:in|of) ({_NAME})",)),
    "birth_year": _Fact("{s} born", "{s} birth year", (
        r"\(born (\d{3,4})\)", r"\((\d{3,4})–\d{3,4}\)", r"born in (\d{3,4}) in", r"born in [^.]*?, in (\d{3,4})")),
    "birth_city": _Fact("{s} born in city", "{s} birthplace", (
        rf"[Bb]orn in ({_NAME}), {_NAME}", rf"born in \d+ in ({_NAME}), {_NAME}")),
    "birth_country": _Fact("{s} born", "{s} birthplace", (
        rf"[Bb]orn in {_NAME}, ({_NAME})", rf"born in \d+ in {_NAME}, ({_NAME})")),
    "founder": _Fact("{s} founded by", "founder of {s}", (
        rf"founded in \d+ by ({_NAME})\.", rf"founded by ({_NAME}) in \d+")),
    "founded_year": _Fact("{s} founded in year", "{s} company history", (
        r"founded in (\d+) by", rf"founded by {_NAME} in (\d+)")),
    "city_founded": _Fact("{s} founded", "{s} city history", (r"founded in (\d+) as", r"dates back to (\d+)")),
    "hq": _Fact("{s} headquarters", "{s} headquartered in", (
        rf"headquartered in ({_NAME}),", rf"headquarters are in ({_NAME}),")),
    "creator": _Fact("{s} {kind}", "{kind} {s} {role}", (rf" by the (?:[A-Z][\w-]* )+[a-z][a-z ]*? ({_NAME})\.",)),
    "work_year": _Fact("{s} {kind}", "{s} year", (r"is an? (\d{3,4}) ",)),
    "sea": _Fact("{s} flows into sea", "{s} mouth", (rf"emptying into the ({_NAME})",)),
    "river_of_city": _Fact("{s} river", "river through {s}", (
        rf"lies on the ({_NAME})\.", rf"The ({_NAME}) flows through the city")),
    "university": _Fact("{s} studied at university", "{s} graduated", (
        rf"(?:studied at|graduated from) the ({_NAME})\.",)),
    "univ_city": _Fact("{s}", "{s} university city", (rf"university in ({_NAME}),",)),
    "company_of": _Fact("{s} founded company", "{s} founder", (
        rf"founded ({_NAME}), an? ", rf"founder of ({_NAME}), which")),
    "population": _Fact("{s} population", "{s} inhabitants million", (
        r"population of about ([\d.]+) million", r"roughly ([\d.]+) million inhabitants")),
    "length": _Fact("{s} length kilometres", "{s} long", (r"is ([\d,]+) kilometres long",)),
}
# question pattern -> the facts to look up in order ("a"/"b": the question's entities, "v": the
# previous fact's value) and, for comparisons, which side wins (min/max of the two values)
_QUESTIONS: tuple[tuple[re.Pattern[str], tuple[tuple[str, str], ...], str | None], ...] = tuple(
    (re.compile(p), hops, pick) for p, hops, pick in (
        (r"^In which country was the founder of (?P<a>.+) born\?$", (("founder", "a"), ("birth_country", "v")), None),
        (rf"^In what year was the (?P<role>\w+) of the (?P<kind>{_KINDS}) (?P<a>.+) born\?$",
         (("creator", "a"), ("birth_year", "v")), None),
        (r"^What is the capital of the country where (?P<a>.+) was born\?$",
         (("birth_country", "a"), ("capital", "v")), None),
        (r"^In which city is the company founded by (?P<a>.+) headquartered\?$",
         (("company_of", "a"), ("hq", "v")), None),
        (r"^In which city is the university that (?P<a>.+) attended\?$",
         (("university", "a"), ("univ_city", "v")), None),
        (r"^What currency is used in the country where (?P<a>.+) is located\?$",
         (("country_of_city", "a"), ("currency", "v")), None),
        (r"^Which river flows through the capital of (?P<a>.+)\?$", (("capital", "a"), ("river_of_city", "v")), None),
        (r"^In what year was the head of state of (?P<a>.+) born\?$", (("head", "a"), ("birth_year", "v")), None),
        (r"^Which company was founded first, (?P<a>.+) or (?P<b>.+)\?$",
         (("founded_year", "a"), ("founded_year", "b")), "min"),
        (r"^Who was born first, (?P<a>.+) or (?P<b>.+)\?$", (("birth_year", "a"), ("birth_year", "b")), "min"),
        (r"^Which river is longer, the (?P<a>.+) or the (?P<b>.+)\?$", (("length", "a"), ("length", "b")), "max"),
        (r"^Which country has the larger population, (?P<a>.+) or (?P<b>.+)\?$",
         (("population", "a"), ("population", "b")), "max"),
        (r"^Which city was founded earlier, (?P<a>.+) or (?P<b>.+)\?$",
         (("city_founded", "a"), ("city_founded", "b")), "min"),
        (r"^(?:What is|Which city is) the capital of (?P<a>.+)\?$", (("capital", "a"),), None),
        (r"^What is the currency of (?P<a>.+)\?$", (("currency", "a"),), None),
        (r"^Who is the head of state of (?P<a>.+)\?$", (("head", "a"),), None),
        (r"^(?:In which country is (?P<a>.+) located|(?P<a2>.+) is a city in which country)\?$",
         (("country_of_city", "a"),), None),
        (r"^(?:In which year|When) was (?P<a>.+) born\?$", (("birth_year", "a"),), None),
        (r"^In which city was (?P<a>.+) born\?$", (("birth_city", "a"),), None),
        (r"^Who (?:founded|is the founder of) (?P<a>.+)\?$", (("founder", "a"),), None),
        (r"^In what year was (?P<a>.+) founded\?$", (("founded_year", "a"),), None),
        (r"^In which city is (?P<a>.+) headquartered\?$", (("hq", "a"),), None),
        (rf"^Who (?P<verb>wrote|composed|painted|directed) the (?P<kind>{_KINDS}) (?P<a>.+)\?$",
         (("creator", "a"),), None),
        (rf"^In what year was the (?P<kind>{_KINDS}) (?P<a>.+) created\?$", (("work_year", "a"),), None),
        (r"^Into which sea does the (?P<a>.+) flow\?$", (("sea", "a"),), None),
    ))
_ROLE = {"wrote": "author", "composed": "composer", "painted": "painter", "directed": "director"}
_QWORDS = frozenset("what which who whom when where why how is was are were does do did the a an in of into".split())


def _passages(view: TurnView) -> list[tuple[str, str]]:
    """(title, text) of every passage in the window, newest search first."""
    out: list[tuple[str, str]] = []
    for obs in reversed([o for o, _ in view.history] + [view.observation]):
        for line in obs.removeprefix("<information>").removesuffix("</information>").split("\n"):
            m = _DOC.match(line.removeprefix("<information>").removesuffix("</information>"))
            if m:
                out.append((m["title"], m["text"]))
    return out


def _lookup(fact: _Fact, subject: str, passages: list[tuple[str, str]]) -> str | None:
    s = re.escape(subject)
    for title, text in passages:
        for pattern in fact.own if title == subject else ():
            m = re.search(pattern.replace("{s}", s), text)
            if m:
                return m.group(1).strip()
    for title, text in passages:
        for pattern in fact.other:
            m = re.search(pattern.replace("{s}", s), text)
            if m:
                return m.group(1).strip() if m.groups() else title
    return None


def _number(value: str) -> float:
    return float(value.replace(",", ""))


def _searchqa(view: TurnView, variant: str) -> str:
    question = view.task.strip()
    issued = {re.sub(r"\s+", " ", a[len("<search>"):-len("</search>")].strip().lower())
              for _, a in view.history if a.startswith("<search>") and a.endswith("</search>")}
    passages = _passages(view)
    last_turn = view.max_steps - view.step <= 1
    for pattern, hops, pick in _QUESTIONS:
        m = pattern.match(question)
        if m is None:
            continue
        groups = {k: v for k, v in m.groupdict().items() if v}
        if "a2" in groups:
            groups["a"] = groups.pop("a2")
        groups.setdefault("role", _ROLE.get(groups.get("verb", ""), ""))
        values: list[str] = []
        for i, (name, ref) in enumerate(hops):
            fact = _FACTS[name]
            subject = values[-1] if ref == "v" else groups[ref]
            value = _lookup(fact, subject, passages)
            if value is not None:
                values.append(value)
                continue
            if last_turn:
                break
            # b words a few searches differently: a one-fact question's keywords, a bridge's second fact
            order = ((fact.query_b, fact.query) if variant == "b" and pick is None and i == 1
                     else (fact.query, fact.query_b))
            queries = [q.format(s=subject, kind=groups.get("kind", ""), role=groups.get("role", "")).strip()
                       for q in (*order, "{s}")]
            if variant == "b" and len(hops) == 1:
                queries.insert(0, " ".join(w for w in re.findall(r"[\w'-]+", question) if w.lower() not in _QWORDS))
            fresh = [q for q in queries if re.sub(r"\s+", " ", q.lower()) not in issued]
            if fresh:
                return f"<search>{fresh[0]}</search>"
            break
        if pick is not None and len(values) == 2:
            a, b = (_number(v) for v in values)
            wins_a = a < b if pick == "min" else a > b
            return f"<answer>{groups['a'] if wins_a else groups['b']}</answer>"
        if len(values) == len(hops):
            return f"<answer>{values[-1]}</answer>"
        # out of turns or queries: the best guess is what the last fact found, else the subject
        guess = values[-1] if values else groups.get("a", "unknown")
        return f"<answer>{guess}</answer>"
    # a question no rule knows: search it once, then answer with the top passage's title
    if not issued and not last_turn:
        return f"<search>{question}</search>"
    return f"<answer>{passages[0][0] if passages else 'unknown'}</answer>"


_POLICIES: dict[str, Callable[[TurnView, str], str]] = {
    "household": _household,
    "shop": _shop,
    "searchqa": _searchqa,
}
