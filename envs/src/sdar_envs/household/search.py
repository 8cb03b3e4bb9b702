"""The household search: which receptacle to look in next for an object type.

One ranking for the sim's gold policy (`sim_expert.GoldPolicy`, from the game's state) and the observation-only rule
expert (`rule_expert`, from what a transcript shows): the receptacles that can hold the object, likeliest first by
location prior (what anyone knows about where apples are, not this room's layout), ties by type then number (the
listing order). Each caller says which receptacles are still unseen (the sim knows; the rule expert reads it off the
messages). The PDDL recipe planner (`engine_plan.domain_plan`) never searches: it reads where every object is off
the facts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sdar_envs.household.catalog import CAN_CONTAIN
from sdar_envs.household.priors import LOCATION_PRIORS


def type_of(name: str) -> str:
    """The type of a receptacle or object name: 'cabinet 3' -> 'cabinet' (a name without a number is its own)."""
    kind, _, num = name.rpartition(" ")
    return kind if num.isdigit() else name


def listing_order(name: str) -> tuple[str, int]:
    """'cabinet 3' -> ('cabinet', 3): by type, then number ascending, the order a systematic search goes through
    receptacles (the sim's `rorder`, the memory's "Not visited" line)."""
    kind, _, num = name.rpartition(" ")
    return (kind, int(num)) if num.isdigit() else (name, 0)


@dataclass(frozen=True)
class HouseholdSearch:
    """Where to look for objects of type `otype`.

    skip: a receptacle type not searched: the goal's (the object never starts where the task puts it).
    known: rank by these receptacle types, in this order, then in listing order, instead of by prior, and search any
        receptacle: the sim's experts without the priors, who know just what a skills text lists
        (`skills.listed_search_order`) or nothing (an empty tuple); None ranks by prior.
    per_step: the rule expert's variant b: the prior divided by the steps it takes to see inside (a closed
        receptacle costs an extra "open"), ties by type and number descending; a second expert that agrees with the
        default on most turns, so a pool of both disagrees on some. None: the prior alone, numbers ascending.
    """

    otype: str
    skip: str | None = None
    known: tuple[str, ...] | None = None
    per_step: Callable[[str], int] | None = None

    def key(self, name: str) -> tuple:
        """The ranking key of a receptacle (smaller is searched first)."""
        kind, num = listing_order(name)
        if self.known is not None:
            return (self.known.index(kind) if kind in self.known else len(self.known), kind, num)
        p = LOCATION_PRIORS.get(self.otype, {}).get(type_of(name), 0.0)
        if self.per_step is not None:
            return (-p / self.per_step(name), kind, -num)
        return (-p, kind, num)

    def worth(self, name: str) -> bool:
        """Whether the search looks in `name`: a type that can hold the object and is not skipped (by prior); any
        receptacle (by the `known` types: that expert does not know what holds what)."""
        if self.known is not None:
            return True
        kind = type_of(name)
        return self.otype in CAN_CONTAIN.get(kind, ()) and kind != self.skip

    def ranked(self, names: Iterable[str]) -> list[str]:
        """The receptacles of `names` worth searching, first to search first."""
        return sorted((r for r in names if self.worth(r)), key=self.key)

    def first(self, unseen: list[str]) -> str | None:
        """The sim's next receptacle among those not yet seen: the first ranked; once none is worth searching, the
        first in listing order (None: every receptacle seen).

        The rule expert falls back to the whole room in this key's order instead (the goal's type included): the two
        were written apart and neither choice was measured better, and keeping both leaves every warm start and
        replay pair made with them as it was."""
        ranked = self.ranked(unseen)
        if ranked:
            return ranked[0]
        return min(unseen, key=listing_order) if unseen else None
