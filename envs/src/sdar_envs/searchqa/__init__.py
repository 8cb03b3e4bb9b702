"""Search-QA family (Search-R1 style): BM25 over an offline corpus, <search>/<answer> actions, EM reward.

The default corpus is rendered from a generated world of facts; see `SearchQAEnv` and `SearchQAConfig`.
"""

from sdar_envs.searchqa.corpus import (
    BACKENDS,
    Passage,
    build_corpus,
    corpus_stats,
    load_wiki_passages,
)
from sdar_envs.searchqa.env import (
    ACTION_TEMPLATES,
    INSTRUCTIONS,
    SearchQAConfig,
    SearchQAEnv,
    parse_action,
)
from sdar_envs.searchqa.expert import evaluate_policy, retrieval_hit_rate, run_episode
from sdar_envs.searchqa.questions import QUESTION_TYPES, SPLITS, Question, build_questions
from sdar_envs.searchqa.retrieval import BM25Index, format_information, get_index
from sdar_envs.searchqa.scoring import exact_match, f1_score, normalize_answer
from sdar_envs.searchqa.skills import HINT_TEMPLATES, SEARCHQA_SKILLS

__all__ = [
    "ACTION_TEMPLATES",
    "BACKENDS",
    "HINT_TEMPLATES",
    "INSTRUCTIONS",
    "QUESTION_TYPES",
    "SEARCHQA_SKILLS",
    "SPLITS",
    "BM25Index",
    "Passage",
    "Question",
    "SearchQAConfig",
    "SearchQAEnv",
    "build_corpus",
    "build_questions",
    "corpus_stats",
    "evaluate_policy",
    "exact_match",
    "f1_score",
    "format_information",
    "get_index",
    "load_wiki_passages",
    "normalize_answer",
    "parse_action",
    "retrieval_hit_rate",
    "run_episode",
]
