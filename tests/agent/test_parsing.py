from sdar.agent import parse_response

ADM = ["go to fridge 1", "open fridge 1", "look"]


def test_household_action_extraction_and_admissibility():
    p = parse_response("<think>it is cold</think><action> go to   fridge 1 </action>", "household", ADM)
    assert p.valid and p.action == "go to fridge 1"
    p = parse_response("<action>go to sofa 1</action>", "household", ADM)
    assert p.valid_format and not p.admissible and not p.valid and p.error == "action not admissible"
    p = parse_response("go to fridge 1", "household", ADM)
    assert not p.valid_format and p.error == "no <action> block"
    p = parse_response("<action>look</action><action>look</action>", "household", ADM)
    assert not p.valid and "more than one" in p.error


def test_require_think():
    assert not parse_response("<action>look</action>", "household", ADM, require_think=True).valid
    assert parse_response("<think>x</think><action>look</action>", "household", ADM, require_think=True).valid


def test_searchqa_forms_are_sent_verbatim():
    p = parse_response("<think>hm</think><search> capital of Ruritania </search>", "searchqa")
    assert p.valid and p.action == "<search>capital of Ruritania</search>"
    p = parse_response("<answer>Paris</answer>", "searchqa")
    assert p.valid and p.action == "<answer>Paris</answer>"
    p = parse_response("<search>a</search><answer>b</answer>", "searchqa")
    assert not p.valid and "more than one" in p.error
    assert not parse_response("Paris", "searchqa").valid


def test_overlong_actions_are_cut():
    p = parse_response("<action>" + "x" * 5000 + "</action>", "shop", None, max_action_chars=100)
    assert len(p.action) == 100


def test_a_free_text_template_admits_its_filled_actions():
    """The shop lists its search box as `search[<query>]`: a real search is admissible, an empty one is not."""
    adm = ["search[<query>]", "click[back to search]"]
    assert parse_response("<action>search[red mug under 20 dollars]</action>", "shop", adm).valid
    assert parse_response("<action>click[back to search]</action>", "shop", adm).valid
    for bad in ("search[]", "click[buy now]", "searching[mug]"):
        p = parse_response(f"<action>{bad}</action>", "shop", adm)
        assert p.valid_format and not p.admissible, bad
