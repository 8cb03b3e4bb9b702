import pytest

from sdar.agent.prompts import PRIVILEGED_HEADER, PromptBuilder, TurnView, fit_prompt_ids
from sdar.models import train_tokenizer


def view(n_hist=3):
    return TurnView(task="put a clean apple in fridge", step=3, max_steps=12, observation="You arrive at sinkbasin 1.",
                    admissible_actions=["go to fridge 1", "clean apple 1 with sinkbasin 1"],
                    history=[(f"obs {i}", f"act {i}") for i in range(n_hist)], memory="Seen: nothing yet. Holding: apple 1.")


def test_student_prompt_holds_task_step_memory_history_and_actions():
    text = PromptBuilder("household", history=2).user_text(view())
    assert "Task: put a clean apple in fridge" in text and "Step 4 of 12." in text
    assert "Holding: apple 1." in text
    assert "obs 0" not in text and "obs 1" in text and "act 2" in text  # last 2 pairs only
    assert "\nAdmissible actions: go to fridge 1, clean apple 1 with sinkbasin 1\n" in text
    assert text.endswith("\nSeen: nothing yet. Holding: apple 1.")  # the memory comes last


def test_teacher_prompt_is_the_student_prompt_with_the_privileged_prefix():
    b = PromptBuilder("household")
    s = b.messages(view())
    t = b.messages(view(), skills="SKILL TEXT")
    assert t[0] == s[0]
    assert t[1]["content"] == f"{PRIVILEGED_HEADER}\nSKILL TEXT\n\n" + s[1]["content"]


@pytest.fixture(scope="module")
def tok():
    b = PromptBuilder("household")
    return train_tokenizer([b.messages(view(), skills="skills " * 20)[1]["content"]] * 5, vocab_size=400)


def test_fit_drops_history_first_and_never_the_skills(tok):
    b = PromptBuilder("household", history=2)
    full, dropped = fit_prompt_ids(tok, b, view(), 10_000, skills="alpha beta gamma")
    assert dropped == 0
    shorter, dropped = fit_prompt_ids(tok, b, view(), len(full) - 1, skills="alpha beta gamma")
    assert dropped >= 1 and len(shorter) < len(full)
    assert "alpha beta gamma" in tok.decode(shorter)
    with pytest.raises(ValueError, match=r"privileged skills \+ turn\) needs .* over the limit of 20"):
        fit_prompt_ids(tok, b, view(), 20, skills="alpha beta gamma")
