"""The question templates of search QA: for each question type, every instance a world offers as a candidate
(template name, question text, gold answers with their aliases, and the hops a solver must search for). Which
candidates become questions, with their task ids and splits, is in searchqa/questions.py."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from sdar_envs.searchqa.world import World


@dataclass(frozen=True)
class Hop:
    """One fact a solver must retrieve.

    query: a good search query for it (what the expert issues).
    alt_query: a reformulation the expert tries when `query` did not surface the fact.
    subject: names of the entity the fact is about (its article title first).
    value: the fact itself with its aliases (first is canonical).
    """

    query: str
    alt_query: str
    subject: tuple[str, ...]
    value: tuple[str, ...]


# ---- aliases ----------------------------------------------------------------------------
def _country(w: World, name: str) -> tuple[str, ...]:
    return (name, w.countries[name].formal_name)


def _city(w: World, name: str) -> tuple[str, ...]:
    alias = w.cities[name].alias
    return (name, alias) if alias else (name,)


def _person(w: World, name: str) -> tuple[str, ...]:
    full = w.people[name].full_name
    return (name, full) if full != name else (name,)


def _company(w: World, name: str) -> tuple[str, ...]:
    return (name, w.companies[name].formal_name)


def _river(name: str) -> tuple[str, ...]:
    return (name, name.removesuffix(" River"))


def _sea(name: str) -> tuple[str, ...]:
    return (name, "Sea of " + name.removesuffix(" Sea"))


# A template yields (template name, question text, answers, hops) for each instance.
Candidate = tuple[str, str, tuple[str, ...], tuple[Hop, ...]]

_CREATOR_ROLE = {
    "novel": ("author", "wrote"),
    "poetry collection": ("author", "wrote"),
    "opera": ("composer", "composed"),
    "painting": ("painter", "painted"),
    "film": ("director", "directed"),
}


class _Bank:
    """Candidates collected per template name."""

    def __init__(self) -> None:
        self.by: dict[str, list[Candidate]] = {}

    def add(self, template: str, text: str, answers: tuple[str, ...], *hops: Hop) -> None:
        self.by.setdefault(template, []).append((template, text, tuple(answers), hops))


def single_hop_candidates(w: World, rng: random.Random) -> dict[str, list[Candidate]]:
    b = _Bank()
    _place_facts(b, w, rng)
    _people_facts(b, w, rng)
    _thing_facts(b, w)
    return b.by


def _place_facts(b: _Bank, w: World, rng: random.Random) -> None:
    """One-hop questions about countries and cities."""
    for k in w.countries.values():
        country, capital = _country(w, k.name), _city(w, k.capital)
        text = rng.choice(
            (f"What is the capital of {k.name}?", f"Which city is the capital of {k.name}?")
        )
        b.add(
            "capital_of",
            text,
            capital,
            Hop(f"capital of {k.name}", f"{k.name} capital city", country, capital),
        )
        b.add(
            "currency_of",
            f"What is the currency of {k.name}?",
            (k.currency, k.currency + "s"),
            Hop(f"{k.name} currency", f"currency used in {k.name}", country, (k.currency,)),
        )
        if k.head_of_state:
            leader = _person(w, k.head_of_state)
            b.add(
                "head_of_state",
                f"Who is the head of state of {k.name}?",
                leader,
                Hop(f"{k.name} head of state", f"{k.name} leader politician", country, leader),
            )
    for c in w.cities.values():
        text = rng.choice(
            (f"In which country is {c.name} located?", f"{c.name} is a city in which country?")
        )
        country = _country(w, c.country)
        b.add(
            "city_country",
            text,
            country,
            Hop(f"{c.name} city country", f"where is {c.name}", _city(w, c.name), country),
        )


def _people_facts(b: _Bank, w: World, rng: random.Random) -> None:
    """One-hop questions about people and the companies they founded."""
    for p in w.people.values():
        person, year, city = _person(w, p.name), (str(p.birth_year),), _city(w, p.birth_city)
        text = rng.choice((f"In which year was {p.name} born?", f"When was {p.name} born?"))
        b.add("birth_year", text, year, Hop(f"{p.name} born", f"{p.name} birth year", person, year))
        b.add(
            "birth_city",
            f"In which city was {p.name} born?",
            city,
            Hop(f"{p.name} born in city", f"{p.name} birthplace", person, city),
        )
    for co in w.companies.values():
        company, founder = _company(w, co.name), _person(w, co.founder)
        text = rng.choice((f"Who founded {co.name}?", f"Who is the founder of {co.name}?"))
        b.add(
            "founder_of",
            text,
            founder,
            Hop(f"{co.name} founded by", f"founder of {co.name}", company, founder),
        )
        b.add(
            "founded_year",
            f"In what year was {co.name} founded?",
            (str(co.founded),),
            Hop(
                f"{co.name} founded in year",
                f"{co.name} company history",
                company,
                (str(co.founded),),
            ),
        )
        hq = _city(w, co.hq_city)
        b.add(
            "hq_city",
            f"In which city is {co.name} headquartered?",
            hq,
            Hop(f"{co.name} headquarters", f"{co.name} headquartered in", company, hq),
        )


def _thing_facts(b: _Bank, w: World) -> None:
    """One-hop questions about works and rivers."""
    for wk in w.works.values():
        role, verb = _CREATOR_ROLE[wk.kind]
        creator, year = _person(w, wk.creator), (str(wk.year),)
        b.add(
            "creator_of",
            f"Who {verb} the {wk.kind} {wk.title}?",
            creator,
            Hop(f"{wk.title} {wk.kind}", f"{wk.kind} {wk.title} {role}", (wk.title,), creator),
        )
        b.add(
            "work_year",
            f"In what year was the {wk.kind} {wk.title} created?",
            year,
            Hop(f"{wk.title} {wk.kind}", f"{wk.title} year", (wk.title,), year),
        )
    for rv in w.rivers.values():
        b.add(
            "river_sea",
            f"Into which sea does the {rv.name} flow?",
            _sea(rv.sea),
            Hop(f"{rv.name} flows into sea", f"{rv.name} mouth", _river(rv.name), _sea(rv.sea)),
        )


def _born(w: World, p: str, value: tuple[str, ...], alt: str) -> Hop:
    return Hop(f"{p} born", f"{p} {alt}", _person(w, p), value)


def two_hop_candidates(w: World, rng: random.Random) -> dict[str, list[Candidate]]:
    b = _Bank()
    _creator_chains(b, w)
    _people_chains(b, w)
    _place_chains(b, w)
    return b.by


def _creator_chains(b: _Bank, w: World) -> None:
    """Two-hop questions through a company's founder or a work's creator."""

    for co in w.companies.values():
        company, founder, k = (
            _company(w, co.name),
            _person(w, co.founder),
            w.birth_country(co.founder),
        )
        b.add(
            "founder_birth_country",
            f"In which country was the founder of {co.name} born?",
            _country(w, k.name),
            Hop(f"{co.name} founded by", f"founder of {co.name}", company, founder),
            _born(w, co.founder, _country(w, k.name), "birthplace"),
        )
    for wk in w.works.values():
        role, _ = _CREATOR_ROLE[wk.kind]
        p = w.people[wk.creator]
        b.add(
            "creator_birth_year",
            f"In what year was the {role} of the {wk.kind} {wk.title} born?",
            (str(p.birth_year),),
            Hop(
                f"{wk.title} {wk.kind}",
                f"{wk.kind} {wk.title} {role}",
                (wk.title,),
                _person(w, p.name),
            ),
            _born(w, p.name, (str(p.birth_year),), "birth year"),
        )


def _people_chains(b: _Bank, w: World) -> None:
    """Two-hop questions through a person's birthplace, company or university."""

    for p in w.people.values():
        k, person = w.birth_country(p.name), _person(w, p.name)
        b.add(
            "birthplace_capital",
            f"What is the capital of the country where {p.name} was born?",
            _city(w, k.capital),
            _born(w, p.name, _country(w, k.name), "birthplace"),
            Hop(
                f"capital of {k.name}",
                f"{k.name} capital city",
                _country(w, k.name),
                _city(w, k.capital),
            ),
        )
        if p.company:
            co = w.companies[p.company]
            company, hq = _company(w, co.name), _city(w, co.hq_city)
            b.add(
                "founded_company_hq",
                f"In which city is the company founded by {p.name} headquartered?",
                hq,
                Hop(f"{p.name} founded company", f"{p.name} founder", person, company),
                Hop(f"{co.name} headquarters", f"{co.name} headquartered in", company, hq),
            )
        if p.university and not p.university.startswith("University of "):
            u = w.universities[p.university]  # "University of <city>" would give the answer away
            b.add(
                "alma_mater_city",
                f"In which city is the university that {p.name} attended?",
                _city(w, u.city),
                Hop(f"{p.name} studied at university", f"{p.name} graduated", person, (u.name,)),
                Hop(f"{u.name}", f"{u.name} university city", (u.name,), _city(w, u.city)),
            )


def _place_chains(b: _Bank, w: World) -> None:
    """Two-hop questions through a city's country or a country's capital and head of state."""

    for c in w.cities.values():
        k = w.countries[c.country]
        b.add(
            "city_currency",
            f"What currency is used in the country where {c.name} is located?",
            (k.currency, k.currency + "s"),
            Hop(
                f"{c.name} city country",
                f"where is {c.name}",
                _city(w, c.name),
                _country(w, k.name),
            ),
            Hop(
                f"{k.name} currency",
                f"currency used in {k.name}",
                _country(w, k.name),
                (k.currency,),
            ),
        )
    for k in w.countries.values():
        country, cap = _country(w, k.name), w.cities[k.capital]
        if len(cap.rivers) == 1:
            river = _river(cap.rivers[0])
            b.add(
                "capital_river",
                f"Which river flows through the capital of {k.name}?",
                river,
                Hop(f"capital of {k.name}", f"{k.name} capital city", country, _city(w, cap.name)),
                Hop(f"{cap.name} river", f"river through {cap.name}", _city(w, cap.name), river),
            )
        if k.head_of_state:
            p = w.people[k.head_of_state]
            b.add(
                "leader_birth_year",
                f"In what year was the head of state of {k.name} born?",
                (str(p.birth_year),),
                Hop(
                    f"{k.name} head of state",
                    f"{k.name} leader politician",
                    country,
                    _person(w, p.name),
                ),
                _born(w, p.name, (str(p.birth_year),), "birth year"),
            )


def comparison_candidates(
    w: World, rng: random.Random, per_template: int
) -> dict[str, list[Candidate]]:
    """Pairs with different values; which side wins is balanced by the pair's random order."""
    year, km = str, "{:,}".format  # as the passages print them, so the fact can be found verbatim
    specs: list[tuple[str, list[str], Callable, Callable, Callable, Callable, Callable]] = [
        (
            "company_older",
            list(w.companies),
            lambda n: w.companies[n].founded,
            lambda a, b: f"Which company was founded first, {a} or {b}?",
            lambda n: (f"{n} founded in year", f"{n} company history", _company(w, n)),
            min,
            year,
        ),
        (
            "person_older",
            list(w.people),
            lambda n: w.people[n].birth_year,
            lambda a, b: f"Who was born first, {a} or {b}?",
            lambda n: (f"{n} born", f"{n} birth year", _person(w, n)),
            min,
            year,
        ),
        (
            "river_longer",
            list(w.rivers),
            lambda n: w.rivers[n].length_km,
            lambda a, b: f"Which river is longer, the {a} or the {b}?",
            lambda n: (f"{n} length kilometres", f"{n} long", _river(n)),
            max,
            km,
        ),
        (
            "country_larger_population",
            list(w.countries),
            lambda n: w.countries[n].population_m,
            lambda a, b: f"Which country has the larger population, {a} or {b}?",
            lambda n: (f"{n} population", f"{n} inhabitants million", _country(w, n)),
            max,
            str,
        ),
        (
            "city_older",
            list(w.cities),
            lambda n: w.cities[n].founded,
            lambda a, b: f"Which city was founded earlier, {a} or {b}?",
            lambda n: (f"{n} founded", f"{n} city history", _city(w, n)),
            min,
            year,
        ),
    ]
    t: dict[str, list[Candidate]] = {}
    for name, pool, value, text, hop_of, pick, fmt in specs:
        seen: set[frozenset[str]] = set()
        out: list[Candidate] = []
        for _ in range(per_template * 20):
            if len(out) >= per_template:
                break
            a, b = rng.sample(pool, 2)
            if value(a) == value(b) or frozenset((a, b)) in seen:
                continue
            seen.add(frozenset((a, b)))
            winner = pick((a, b), key=value)
            answers = hop_of(winner)[2]
            hops = tuple(
                Hop(q, alt, subj, (fmt(value(n)),)) for n in (a, b) for q, alt, subj in [hop_of(n)]
            )
            out.append((name, text(a, b), answers, hops))
        t[name] = out
    return t
