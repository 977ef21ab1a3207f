from engine.envs.base import extract_answer, unknown_choice


def test_extract_answer_takes_last_tagged_answer_stripped():
    assert extract_answer("<answer> 42 </answer>") == "42"
    assert extract_answer("a <answer>1</answer> b <answer>2</answer> c") == "2"
    assert extract_answer("<answer><answer>3</answer>") == "3"
    assert extract_answer("x <answer>\n left\n</answer>") == "left"


def test_extract_answer_falls_back_to_stripped_text():
    assert extract_answer("  7 \n") == "7"
    assert extract_answer("<answer>5") == "<answer>5"  # unclosed: no tag pair
    assert extract_answer("</answer>x<answer>") == "</answer>x<answer>"  # closing tag before opening
    assert extract_answer("") == ""


def test_extract_answer_on_megabytes_of_unclosed_tags_returns_the_text():
    text = "<answer>" * 1_000_000
    assert extract_answer(text) == text


def test_unknown_choice_puts_close_matches_first_and_lists_all():
    err = unknown_choice("colour", "gren", ["red", "green", "blue"])
    assert isinstance(err, ValueError)
    assert str(err) == "unknown colour 'gren' (did you mean 'green'?); known: red, green, blue"
    assert str(unknown_choice("colour", "zzz", ["red"])) == "unknown colour 'zzz'; known: red"
