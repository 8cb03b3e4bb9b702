"""A synthetic world of structured facts (countries, cities, people, companies, works, rivers).

Deterministic from a seed and fictional on purpose: no model can answer from memory, so the
questions built on it can only be solved by searching the corpus rendered from these facts.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from dataclasses import dataclass, field

# fmt: off
CONTINENTS = ("Africa", "Asia", "Europe", "North America", "South America", "Oceania")
CURRENCY_UNITS = (
    "crown", "mark", "dinar", "florin", "lira", "shilling", "franc", "taler", "ducat", "real",
)
GOVERNMENTS = (
    "parliamentary republic", "presidential republic", "federal republic",
    "semi-presidential republic",
)
INDUSTRIES = (
    "automotive", "software", "shipbuilding", "pharmaceutical", "steel", "textile", "aerospace",
    "telecommunications", "chemical", "food processing", "mining", "banking", "railway",
    "electronics",
)
COMPANY_WORDS = {
    "automotive": ("Motors", "Automobiles"), "software": ("Systems", "Software"),
    "shipbuilding": ("Shipyards", "Marine"), "pharmaceutical": ("Pharma", "Laboratories"),
    "steel": ("Steelworks", "Metals"), "textile": ("Textiles", "Mills"),
    "aerospace": ("Aerospace", "Aviation"), "telecommunications": ("Telecom", "Networks"),
    "chemical": ("Chemicals", "Chemie"), "food processing": ("Foods", "Provisions"),
    "mining": ("Mining", "Minerals"), "banking": ("Bank", "Capital"),
    "railway": ("Rail", "Locomotive Works"), "electronics": ("Electronics", "Instruments"),
}
CORPORATE_SUFFIXES = ("Inc.", "Ltd.", "Group", "Corporation")
# occupation -> kind of work they are known for (None: not known for a work)
OCCUPATIONS = {
    "novelist": "novel", "poet": "poetry collection", "composer": "opera", "painter": "painting",
    "film director": "film", "physicist": None, "chemist": None, "engineer": None,
    "entrepreneur": None, "architect": None, "mathematician": None, "politician": None,
    "athlete": None, "explorer": None,
}
CREATIVE = tuple(o for o, w in OCCUPATIONS.items() if w)
FEMALE_NAMES = (
    "Amara", "Beatrix", "Clara", "Dalia", "Elena", "Freya", "Greta", "Hana", "Ines", "Johanna",
    "Katya", "Leona", "Maren", "Nadia", "Olga", "Priya", "Rosa", "Selma", "Tamsin", "Ulla", "Vera",
    "Wanda", "Yara", "Zofia", "Agnes", "Brigit", "Celia", "Dora", "Edith", "Fatima", "Gisela",
    "Helga", "Irena", "Jana", "Lidia", "Mira", "Noor", "Petra", "Ruth", "Sonja", "Thea", "Vesna",
    "Alma", "Ilse", "Lucia", "Marta",
)
MALE_NAMES = (
    "Anton", "Bruno", "Casimir", "Dmitri", "Emil", "Felix", "Gustav", "Henrik", "Ivo", "Jonas",
    "Karl", "Leon", "Matteo", "Nikolai", "Oskar", "Pavel", "Rafael", "Stefan", "Tomas", "Umar",
    "Viktor", "Walter", "Yusuf", "Zoran", "Arvid", "Boris", "Conrad", "Dario", "Erik", "Filip",
    "Goran", "Hugo", "Igor", "Jakob", "Lukas", "Marek", "Nils", "Otto", "Piotr", "Rolf", "Sven",
    "Teodor", "Vilem", "Aurel",
)
TITLE_ADJECTIVES = (
    "Silent", "Golden", "Last", "Hidden", "Broken", "Distant", "Crimson", "Winter", "Northern",
    "Quiet", "Burning", "Forgotten", "Endless", "Hollow", "Restless", "Pale", "Iron", "Glass",
    "Salt", "Summer",
)
TITLE_NOUNS = (
    "Harbour", "Orchard", "Lantern", "Frontier", "Garden", "Mirror", "Tide", "Bridge", "Meadow",
    "Tower", "Voyage", "Archive", "Citadel", "Shore", "Widow", "Pilgrim", "Season", "Compass",
    "Crown", "Letter", "Storm", "River", "Clockmaker", "Cartographer", "Lighthouse", "Signal",
    "Empire", "Feast", "Ember",
)
# frequent English words a generated name must not equal (they would pollute retrieval)
_BANNED = {
    "also", "area", "been", "born", "city", "data", "dear", "fort", "from", "have", "here", "hero",
    "idea", "into", "lake", "lima", "many", "mare", "mine", "more", "most", "much", "new", "only",
    "oslo", "over", "port", "river", "roma", "rose", "saint", "sea", "sofa", "some", "state",
    "such", "than", "that", "their", "them", "then", "there", "they", "this", "were", "what",
    "when", "where", "which", "with", "zero",
}
_ONSETS = (
    "b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kh", "l", "m", "n", "p", "r", "s", "st", "t",
    "tr", "v", "z", "th", "sh", "j", "y", "w", "c", "cl", "v", "m", "l", "r", "n", "s",
)
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou", "ae", "ia", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "rn", "nd", "st", "k", "th", "v", "sk", "lm")
_COUNTRY_FORMS = (
    ("ia", "ian"), ("a", "an"), ("and", "andic"), ("istan", "istani"), ("ova", "ovan"),
    ("ene", "enese"), ("or", "orean"), ("ar", "ari"), ("esh", "eshi"),
)
_CITY_FORMS = ("", "", "", "burg", "ford", "holm", "ton", "vik", "mouth", "stad", "dale", "haven")
_CITY_PREFIXES = ("Port ", "Saint ", "New ", "Fort ", "Lake ")
_SURNAME_FORMS = (
    "son", "sen", "ski", "ez", "ov", "ani", "berg", "ley", "wood", "ell", "er", "ic", "", "",
)
CLIMATES = (
    "temperate", "humid subtropical", "semi-arid", "oceanic", "continental", "tropical", "alpine",
)
# fmt: on


@dataclass(frozen=True)
class Country:
    name: str
    formal_name: str
    demonym: str
    continent: str
    capital: str
    currency: str
    language: str
    population_m: float
    area_km2: int
    independence: int
    government: str
    climate: str
    head_of_state: str = ""


@dataclass(frozen=True)
class City:
    name: str
    country: str
    is_capital: bool
    population: int
    founded: int
    rivers: tuple[str, ...] = ()
    alias: str = ""


@dataclass(frozen=True)
class River:
    name: str
    country: str
    length_km: int
    sea: str
    cities: tuple[str, ...]


@dataclass(frozen=True)
class University:
    name: str
    city: str
    founded: int


@dataclass(frozen=True)
class Person:
    name: str  # "first last": the article title and the canonical answer
    full_name: str  # with a middle initial where the person has one
    female: bool
    birth_year: int
    death_year: int | None
    birth_city: str
    occupation: str
    university: str | None
    company: str | None = None
    works: tuple[str, ...] = ()
    head_of: str | None = None  # the country this person leads


@dataclass(frozen=True)
class Company:
    name: str
    formal_name: str
    industry: str
    founded: int
    founder: str
    hq_city: str
    employees: int


@dataclass(frozen=True)
class Work:
    title: str
    kind: str
    creator: str
    year: int


@dataclass
class World:
    """Every fact of the world, with lookups by name.

    seed: the seed it was generated from (same seed, same world).
    """

    seed: int
    countries: dict[str, Country] = field(default_factory=dict)
    cities: dict[str, City] = field(default_factory=dict)
    rivers: dict[str, River] = field(default_factory=dict)
    seas: list[str] = field(default_factory=list)
    universities: dict[str, University] = field(default_factory=dict)
    people: dict[str, Person] = field(default_factory=dict)
    companies: dict[str, Company] = field(default_factory=dict)
    works: dict[str, Work] = field(default_factory=dict)

    def country_of_city(self, city: str) -> Country:
        return self.countries[self.cities[city].country]

    def birth_country(self, person: str) -> Country:
        return self.country_of_city(self.people[person].birth_city)


@dataclass(frozen=True)
class WorldSize:
    """How many entities of each kind to generate (the defaults give about 6,300 passages).

    countries: sovereign countries, each with 4-7 cities, the first being the capital (a rare
        name clash drops one, so the world may hold slightly fewer).
    rivers, seas, universities, people, works: counts of each kind (universities: at most).
    companies: at most this many; each is founded by a different entrepreneur, engineer or chemist.
    """

    countries: int = 120
    rivers: int = 150
    seas: int = 16
    universities: int = 150
    people: int = 1500
    companies: int = 400
    works: int = 700


class _Names:
    """Unique pronounceable names; one registry so no two entities share a name."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def root(self, syllables: tuple[int, int] = (2, 3)) -> str:
        for _ in range(10_000):
            n = self.rng.randint(*syllables)
            word = "".join(
                self.rng.choice(_ONSETS)
                + self.rng.choice(_VOWELS)
                + (self.rng.choice(_CODAS) if i == n - 1 else "")
                for i in range(n)
            )
            if 4 <= len(word) <= 10 and word not in _BANNED and word not in self.used:
                self.used.add(word)
                return word.capitalize()
        raise RuntimeError("name space exhausted; lower WorldSize counts")

    def claim(self, name: str) -> bool:
        key = name.lower()
        if key in self.used:
            return False
        self.used.add(key)
        return True


@functools.lru_cache(maxsize=4)
def build_world(seed: int = 0, size: WorldSize = WorldSize()) -> World:
    """Generate the world for `seed` (cached; the same seed always gives the same facts).

    Every step draws from one random stream, so the order of the steps is part of the world.
    """
    rng = random.Random(f"sdar-searchqa-world:{seed}")
    names = _Names(rng)
    world = World(seed=seed)
    world.seas = [f"{names.root((2, 2))} Sea" for _ in range(size.seas)]
    city_rows = _add_countries(world, rng, names, size)
    by_country = _add_rivers_and_cities(world, rng, names, size, city_rows)
    _add_universities(world, rng, names, size)
    people = _draw_people(world, rng, names, size)
    _appoint_heads_of_state(world, rng, people)
    _found_companies(world, rng, names, size, people, by_country)
    works_of = _add_works(world, rng, names, size, people)
    _add_people(world, people, works_of)
    return world


def _add_countries(
    world: World, rng: random.Random, names: _Names, size: WorldSize
) -> list[tuple[str, str, bool]]:
    """Countries with their cities named; returns (city, country, is capital) rows, the first
    city of each country being its capital (the cities themselves come with their rivers)."""
    city_rows: list[tuple[str, str, bool]] = []
    for _ in range(size.countries):
        root = names.root((2, 2))
        suffix, dem = rng.choice(_COUNTRY_FORMS)
        stem = root.rstrip("aeiouy") or root
        name, demonym = stem + suffix, stem + dem
        if not names.claim(name) or not names.claim(demonym):
            continue
        n_cities = rng.randint(4, 7)
        cities = []
        while len(cities) < n_cities:
            city = names.root((1, 2)) + rng.choice(_CITY_FORMS)
            if rng.random() < 0.12:
                city = rng.choice(_CITY_PREFIXES) + city
            if names.claim(city):
                cities.append(city)
        for i, c in enumerate(cities):
            city_rows.append((c, name, i == 0))
        kind = rng.choice(("Republic", "Kingdom", "Federation", "Commonwealth", "Union"))
        world.countries[name] = Country(
            name=name,
            formal_name=f"{kind} of {name}",
            demonym=demonym,
            continent=rng.choice(CONTINENTS),
            capital=cities[0],
            currency=f"{demonym} {rng.choice(CURRENCY_UNITS)}",
            language=demonym,
            population_m=round(rng.lognormvariate(2.0, 1.1) + 0.3, 1),
            area_km2=rng.randint(8, 1800) * 1000,
            independence=rng.randint(1791, 1994),
            government=rng.choice(GOVERNMENTS),
            climate=rng.choice(CLIMATES),
        )
    return city_rows


def _add_rivers_and_cities(
    world: World,
    rng: random.Random,
    names: _Names,
    size: WorldSize,
    city_rows: list[tuple[str, str, bool]],
) -> dict[str, list[str]]:
    """Rivers run through cities of one country and end in a sea; then the cities, each knowing its
    rivers. Returns the cities of each country."""
    city_rivers: dict[str, list[str]] = {c: [] for c, _, _ in city_rows}
    by_country: dict[str, list[str]] = {}
    for c, k, _ in city_rows:
        by_country.setdefault(k, []).append(c)
    country_names = list(world.countries)
    for _ in range(size.rivers):
        river = f"{names.root((2, 2))} River"
        country = rng.choice(country_names)
        through = tuple(rng.sample(by_country[country], rng.randint(1, 3)))
        for c in through:
            city_rivers[c].append(river)
        world.rivers[river] = River(
            river, country, rng.randint(80, 3400), rng.choice(world.seas), through
        )
    for c, k, cap in city_rows:
        alias = c.replace("Saint ", "St. ") if c.startswith("Saint ") else ""
        pop = rng.randint(400, 9000) * 1000 if cap else rng.randint(8, 900) * 1000
        world.cities[c] = City(c, k, cap, pop, rng.randint(850, 1890), tuple(city_rivers[c]), alias)
    return by_country


def _add_universities(world: World, rng: random.Random, names: _Names, size: WorldSize) -> None:
    all_cities = list(world.cities)
    for _ in range(size.universities):
        city = rng.choice(all_cities)
        name = (
            f"University of {city}"
            if rng.random() < 0.6
            else f"{names.root((2, 2))} Institute of Technology"
        )
        if names.claim(name):
            world.universities[name] = University(name, city, rng.randint(1200, 1975))


def _draw_people(
    world: World, rng: random.Random, names: _Names, size: WorldSize
) -> dict[str, dict]:
    """People as mutable rows (later steps make some heads of state and founders); surnames repeat
    (families), full names do not."""
    all_cities = list(world.cities)
    univ_names = list(world.universities)
    surnames = [names.root((1, 2)) + rng.choice(_SURNAME_FORMS) for _ in range(size.people // 2)]
    people: dict[str, dict] = {}
    occupations = list(OCCUPATIONS)
    while len(people) < size.people:
        female = rng.random() < 0.5
        first = rng.choice(FEMALE_NAMES if female else MALE_NAMES)
        name = f"{first} {rng.choice(surnames)}"
        if not names.claim(name):
            continue
        middle = f" {chr(rng.randint(65, 90))}." if rng.random() < 0.2 else ""
        birth = rng.randint(1840, 1992)
        death = birth + rng.randint(45, 97) if birth < 1935 or rng.random() < 0.1 else None
        if death is not None and death > 2023:
            death = None
        people[name] = {
            "name": name,
            "full_name": name.replace(" ", middle + " ", 1) if middle else name,
            "female": female,
            "birth_year": birth,
            "death_year": death,
            "birth_city": rng.choice(all_cities),
            "occupation": rng.choice(occupations),
            "university": rng.choice(univ_names) if rng.random() < 0.7 else None,
        }
    return people


def _appoint_heads_of_state(world: World, rng: random.Random, people: dict[str, dict]) -> None:
    """Each country's head of state: a living politician-to-be born there (none if nobody fits)."""
    for country in world.countries.values():
        born_here = [
            p
            for p in people.values()
            if world.cities[p["birth_city"]].country == country.name
            and p["death_year"] is None
            and p["birth_year"] < 1985
            and p["occupation"] != "entrepreneur"
        ]
        born_here = [p for p in born_here if p["occupation"] not in CREATIVE]
        if not born_here:
            continue
        leader = rng.choice(born_here)
        leader["occupation"], leader["head_of"] = "politician", country.name
        world.countries[country.name] = dataclasses.replace(country, head_of_state=leader["name"])


def _found_companies(
    world: World,
    rng: random.Random,
    names: _Names,
    size: WorldSize,
    people: dict[str, dict],
    by_country: dict[str, list[str]],
) -> None:
    """Each founder founds exactly one company, so "the company founded by X" is unique."""
    all_cities = list(world.cities)
    founders = [
        p for p in people.values() if p["occupation"] in ("entrepreneur", "engineer", "chemist")
    ]
    rng.shuffle(founders)
    for founder in founders[: size.companies]:
        industry = rng.choice(INDUSTRIES)
        base = founder["name"].split(" ", 1)[1] if rng.random() < 0.4 else names.root((2, 2))
        name = f"{base} {rng.choice(COMPANY_WORDS[industry])}"
        if not names.claim(name):
            continue
        year = rng.randint(founder["birth_year"] + 22, min(founder["birth_year"] + 60, 2015))
        if founder["death_year"] is not None:
            year = min(year, founder["death_year"] - 1)
        own_country = world.cities[founder["birth_city"]].country
        hq = rng.choice(by_country[own_country]) if rng.random() < 0.7 else rng.choice(all_cities)
        world.companies[name] = Company(
            name,
            f"{name} {rng.choice(CORPORATE_SUFFIXES)}",
            industry,
            year,
            founder["name"],
            hq,
            rng.randint(2, 900) * 100,
        )
        founder["company"] = name


def _add_works(
    world: World, rng: random.Random, names: _Names, size: WorldSize, people: dict[str, dict]
) -> dict[str, list[str]]:
    """Works by creative people; returns each creator's titles."""
    creators = [p for p in people.values() if p["occupation"] in CREATIVE]
    works_of: dict[str, list[str]] = {}
    while len(world.works) < size.works and creators:
        creator = rng.choice(creators)
        title = rng.choice(
            (
                f"The {rng.choice(TITLE_ADJECTIVES)} {rng.choice(TITLE_NOUNS)}",
                f"{rng.choice(TITLE_NOUNS)} of {names.root((2, 2))}",
                f"The {rng.choice(TITLE_NOUNS)} and the {rng.choice(TITLE_NOUNS)}",
            )
        )
        if not names.claim(title):
            continue
        last = min(creator["death_year"] or 2022, 2022)
        year = rng.randint(min(creator["birth_year"] + 20, last), last)
        world.works[title] = Work(title, OCCUPATIONS[creator["occupation"]], creator["name"], year)
        works_of.setdefault(creator["name"], []).append(title)
    return works_of


def _add_people(world: World, people: dict[str, dict], works_of: dict[str, list[str]]) -> None:
    """The people rows, final now, as `Person` facts."""
    for p in people.values():
        world.people[p["name"]] = Person(
            name=p["name"],
            full_name=p["full_name"],
            female=p["female"],
            birth_year=p["birth_year"],
            death_year=p["death_year"],
            birth_city=p["birth_city"],
            occupation=p["occupation"],
            university=p["university"],
            company=p.get("company"),
            works=tuple(works_of.get(p["name"], ())),
            head_of=p.get("head_of"),
        )
