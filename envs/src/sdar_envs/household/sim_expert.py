"""The household sim's gold policy: the expert's next action from any state of a `SimGame` (after mistakes too).
It searches by location priors; the warm start's uninformed expert searches in listing order instead, and its
skilled expert first where the episode's skills text says (`expert_action`). `gold_length`: the steps it needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdar_envs.household.catalog import APPLIANCE, CAN_CONTAIN
from sdar_envs.household.search import HouseholdSearch

if TYPE_CHECKING:
    from sdar_envs.household.sim_game import SimGame


class GoldPolicy:
    """The expert of one game state: it reads the game (what the agent has seen, where things are, the goal) and
    never changes it.

    use_priors=False searches unseen receptacles in listing order instead of by location
    prior: an expert without the privileged knowledge the skills text carries.
    known_order (with use_priors=False): object type -> receptacle types to search first,
    in order, before the listing order: an expert that knows just what a skills text says.
    """

    def __init__(self, game: SimGame, use_priors: bool = True, known_order: dict[str, list[str]] | None = None):
        self.game = game
        self.use_priors = use_priors
        self.known_order = dict(known_order or {})

    def _go_or_open(self, r: int) -> str | None:
        """The step that makes receptacle r reachable and visible, or None when it already is."""
        game = self.game
        if game.loc != r:
            return game.goto[r]
        if not game._visible(r):
            return f"open {game.rname[r]}"
        return None

    def _search(self, otype: str, skip_type: str | None) -> str:
        """Next step of a search for `otype` (`search.HouseholdSearch`): the likeliest unseen receptacle by location
        prior, the goal's type skipped.

        The uninformed expert knows neither the priors nor which receptacle types can hold
        what: it goes through the unseen receptacles in listing order (type, then number),
        the order of the agent memory's "Not visited" line, so its choice is a rule a small
        model can read off the prompt while the skills text carries what it lacks.
        """
        game = self.game
        if self.use_priors:
            search = HouseholdSearch(otype, skip_type)
        else:
            search = HouseholdSearch(otype, known=tuple(self.known_order.get(otype, [])))
        best = search.first([game.rname[r] for r in game.rorder if not game.observed[r]])
        if best is None:
            return "look"
        step = self._go_or_open(game.rindex[best])
        return step if step is not None else "look"

    def _fetch(self, candidates: list[int], skip_type: str | None) -> str:
        """Get one of `candidates` (objects of the target type) into the hand; hands are empty."""
        game = self.game
        known = [o for o in candidates if game.where[o] >= 0 and game.observed[game.where[o]]]
        if not known:
            return self._search(
                game.otype[candidates[0]] if candidates else game.goal.object_type, skip_type
            )
        here = [o for o in known if game.where[o] == game.loc]
        if here:
            o = here[0]
        else:
            o = min(
                known,
                key=lambda i: (not game._visible(game.where[i]), game.rorder.index(game.where[i])),
            )
        r = game.where[o]
        step = self._go_or_open(r)
        return step if step is not None else f"take {game.oname[o]} from {game.rname[r]}"

    def _drop(self) -> str:
        """Put down a held object that the task does not need, as close as possible."""
        game = self.game
        o = game.held
        assert o is not None
        ot = game.otype[o]
        if (
            game.loc is not None
            and game._visible(game.loc)
            and ot in CAN_CONTAIN[game.rtype[game.loc]]
        ):
            return f"move {game.oname[o]} to {game.rname[game.loc]}"
        holders = [r for r in game.rorder if ot in CAN_CONTAIN[game.rtype[r]]]
        r = min(holders, key=lambda i: (not game._visible(i), game.rorder.index(i)))
        step = self._go_or_open(r)
        return step if step is not None else f"move {game.oname[o]} to {game.rname[r]}"

    def _destination(self) -> int:
        """The receptacle to fill: the one holding most targets, else the cheapest to reach."""
        game = self.game
        g = game.goal
        dests = [r for r in game.rorder if game.rtype[r] == g.receptacle_type]

        def key(r: int) -> tuple[int, bool, bool, int]:
            done = sum(
                1 for o in game.contents[r] if game.otype[o] == g.object_type and game.has_goal_state(o)
            )
            return (-done, r != game.loc, not game._visible(r), game.rorder.index(r))

        return min(dests, key=key)

    def next_action(self) -> str:
        """The gold next action from the game's current state (any state, including after mistakes)."""
        game = self.game
        if game.won:
            return "look"
        g = game.goal
        held = game.held
        if g.task_type == "look_at_obj_in_light":
            if held is not None and game.otype[held] == g.object_type:
                lamps = [
                    o
                    for o, t in enumerate(game.otype)
                    if t == g.toggle_type and game.where[o] >= 0 and game.observed[game.where[o]]
                ]
                if lamps:
                    lamp = min(
                        lamps,
                        key=lambda o: (game.where[o] != game.loc, game.rorder.index(game.where[o])),
                    )
                    if game.loc != game.where[lamp]:
                        return game.goto[game.where[lamp]]
                    return f"use {game.oname[lamp]}"
                return self._search(g.toggle_type or "desklamp", None)
            if held is not None:
                return self._drop()
            targets = [o for o, t in enumerate(game.otype) if t == g.object_type]
            return self._fetch(targets, None)

        dest = self._destination()
        if held is not None:
            if game.otype[held] != g.object_type:
                return self._drop()
            if not game.has_goal_state(held):
                app_type = APPLIANCE[g.state]  # type: ignore[index]
                apps = [r for r in game.rorder if game.rtype[r] == app_type]
                app = game.loc if game.loc in apps else apps[0]
                if game.loc != app:
                    return game.goto[app]
                return f"{g.state} {game.oname[held]} with {game.rname[app]}"
            step = self._go_or_open(dest)
            return step if step is not None else f"move {game.oname[held]} to {game.rname[dest]}"
        if g.count > 1:
            targets = [
                o for o, t in enumerate(game.otype) if t == g.object_type and game.where[o] != dest
            ]
        else:
            targets = [
                o
                for o, t in enumerate(game.otype)
                if t == g.object_type
                and not (game.rtype[game.where[o]] == g.receptacle_type and game.has_goal_state(o))
            ]
        return self._fetch(targets, g.receptacle_type)


def expert_action(game: SimGame, use_priors: bool = True, known_order: dict[str, list[str]] | None = None) -> str:
    """The gold next action from the game's current state (any state, including after mistakes); the experts
    without the priors are GoldPolicy's use_priors and known_order."""
    return GoldPolicy(game, use_priors, known_order).next_action()


def gold_length(game: SimGame, limit: int = 400) -> int | None:
    """Steps the gold policy needs from the game's state, playing them on `game` (None if it does not finish within
    `limit`)."""
    start = game.steps
    while not game.won:
        if game.steps - start >= limit:
            return None
        _, valid = game.apply(expert_action(game))
        if not valid:  # a bug in the expert, never expected: report the task as unsolved
            return None
    return game.steps - start
