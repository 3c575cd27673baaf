"""The agreement table of the grading screen (issue 12, "grading that cannot be gamed").

Each case is an answer, its ground truth and its kind: "right" (the plain way of writing the right
value: must score 1), "rewritten" (the right value written another way: must score 1) or "wrong" (close
but wrong, hedged, or not an answer: must score 0). Every answer is graded through all three reward
functions (r1_zero, question_only, answer_tag), each with its own wrapping; RESPONSES holds the cases that
only make sense as a whole response. The bar is no false positive: every "wrong" case scores 0.

`bench/grading.py` prints the agreement counts per category from this table (`agreement()`).
"""

from __future__ import annotations

import pytest

from rlvr.tasks.rewards import get_reward_fn, grade_answer, grading_stats

RIGHT, REWRITTEN, WRONG = "right", "rewritten", "wrong"

# (category, kind, answer, ground truth)
CASES = [
    # Hedging: two or more different values score 0; one value repeated does not hedge.
    ("hedging", RIGHT, "42", "42"),
    ("hedging", REWRITTEN, "42 or 42", "42"),
    ("hedging", REWRITTEN, "The answer is 42.", "42"),
    ("hedging", REWRITTEN, "She has 42 apples left.", "42"),
    ("hedging", REWRITTEN, "\\frac{84}{2} or \\frac{168}{4}", "42"),
    ("hedging", WRONG, "41 or 42", "42"),
    ("hedging", WRONG, "first 7, then 42", "42"),
    ("hedging", WRONG, "between 40 and 42", "42"),
    ("hedging", WRONG, "42 or 43", "42"),
    ("hedging", WRONG, "40-42", "42"),
    ("hedging", WRONG, "40 - 42", "42"),
    ("hedging", WRONG, "40–42", "42"),
    ("hedging", WRONG, "42, 43", "42"),
    ("hedging", WRONG, "42,43", "42"),
    ("hedging", WRONG, "42; 43", "42"),
    ("hedging", WRONG, "either 41 or 42", "42"),
    ("hedging", WRONG, "42 (or maybe 41)", "42"),
    ("hedging", WRONG, "42 (41)", "42"),
    ("hedging", WRONG, "41 42", "42"),
    ("hedging", WRONG, "41\n42", "42"),
    ("hedging", WRONG, "42 | 43", "42"),
    ("hedging", WRONG, "42 to 43", "42"),
    ("hedging", WRONG, "42~43", "42"),
    ("hedging", WRONG, "42 \\pm 1", "42"),
    ("hedging", WRONG, "42 ± 1", "42"),
    ("hedging", WRONG, "41 \\text{ or } 42", "42"),
    ("hedging", WRONG, "41 \\lor 42", "42"),
    ("hedging", WRONG, "\\frac{82}{2} \\text{ or } \\frac{84}{2}", "42"),
    ("hedging", WRONG, "forty-one or 42", "42"),
    ("hedging", WRONG, "42, not forty-one", "42"),
    ("hedging", WRONG, "x = 41 or 42", "42"),
    ("hedging", WRONG, "42 > 41", "42"),
    ("hedging", WRONG, "42 \\approx 41.9", "42"),
    ("hedging", WRONG, "-42 or 42", "42"),
    ("hedging", WRONG, "42 apples and 43 pears", "42"),
    ("hedging", WRONG, "$41 or $42", "42"),
    ("hedging", WRONG, "41 and 42", "42"),
    ("hedging", WRONG, "On day 3 she has 42", "42"),
    ("hedging", WRONG, "42, 43, 44", "43"),
    ("hedging", WRONG, "1,00", "100"),
    # Restated computations: credited only when every side evaluates exactly to the same, right value.
    ("computation", RIGHT, "42", "42"),
    ("computation", REWRITTEN, "6 x 7 = 42", "42"),
    ("computation", REWRITTEN, "6 \\times 7 = 42", "42"),
    ("computation", REWRITTEN, "6 × 7 = 42", "42"),
    ("computation", REWRITTEN, "6 * 7 = 42", "42"),
    ("computation", REWRITTEN, "6 \\cdot 7 = 42", "42"),
    ("computation", REWRITTEN, "40 + 2 = 42", "42"),
    ("computation", REWRITTEN, "84 / 2 = 42", "42"),
    ("computation", REWRITTEN, "84 ÷ 2 = 42", "42"),
    ("computation", REWRITTEN, "\\frac{84}{2} = 42", "42"),
    ("computation", REWRITTEN, "(40 + 2) \\times 1 = 42", "42"),
    ("computation", REWRITTEN, "2^{5} + 10 = 42", "42"),
    ("computation", REWRITTEN, "50\\% \\times 84 = 42", "42"),
    ("computation", REWRITTEN, "x = 6 \\times 7 = 42", "42"),
    ("computation", REWRITTEN, "Total = 6 x 7 = 42", "42"),
    ("computation", REWRITTEN, "So, 6 x 7 = 42 apples", "42"),
    ("computation", REWRITTEN, "6 × 7 = $42", "42"),
    ("computation", REWRITTEN, "42 = 6 x 7", "42"),
    ("computation", REWRITTEN, "1,000 + 234 = 1,234", "1234"),
    ("computation", WRONG, "41 = 42", "42"),
    ("computation", WRONG, "40 + 3 = 42", "42"),
    ("computation", WRONG, "6 x 7 = 41", "42"),
    ("computation", WRONG, "6 x 7 = 42 = 43", "42"),
    ("computation", WRONG, "6 \\times 7 = 43", "43"),
    ("computation", WRONG, "6 x 7 = 42", "43"),
    ("computation", WRONG, "\\sqrt{1764} = 42", "42"),  # cannot be checked here: 0
    ("computation", WRONG, "\\sqrt{5} = 42", "42"),
    ("computation", WRONG, "41 + 1 = 42 or 43", "42"),
    ("computation", WRONG, "forty one or 6 x 7 = 42", "42"),
    ("computation", WRONG, "forty = 42", "42"),
    ("computation", WRONG, "x = 41, 6 x 7 = 42", "42"),
    ("computation", WRONG, "6 x 7 = 42 \\pm 1", "42"),
    ("computation", WRONG, "1/0 = 42", "42"),
    ("computation", WRONG, "9^{9^{9}} = 42", "42"),
    ("computation", WRONG, "x=5, y=6", "5"),
    # Tags inside the answer: not an answer.
    ("tags", RIGHT, "42", "42"),
    ("tags", REWRITTEN, "\\boxed{42}", "42"),
    ("tags", WRONG, "<think> 42 </think>", "42"),
    ("tags", WRONG, "</think> 42", "42"),
    ("tags", WRONG, "42 <think>", "42"),
    ("tags", WRONG, "42 </think>", "42"),
    ("tags", WRONG, "<b>42</b>", "42"),
    ("tags", WRONG, "< think >42", "42"),
    ("tags", WRONG, "42<br/>", "42"),
    # Unicode digits and invisible characters.
    ("unicode", RIGHT, "42", "42"),
    ("unicode", REWRITTEN, "４２", "42"),
    ("unicode", REWRITTEN, "𝟒𝟐", "42"),
    ("unicode", REWRITTEN, "𝟺𝟸", "42"),
    ("unicode", REWRITTEN, "٤٢", "42"),
    ("unicode", REWRITTEN, "۴۲", "42"),
    ("unicode", REWRITTEN, "४२", "42"),
    ("unicode", REWRITTEN, "৪২", "42"),
    ("unicode", REWRITTEN, "4\u200b2", "42"),
    ("unicode", REWRITTEN, "\ufeff42", "42"),
    ("unicode", REWRITTEN, "42\u2060", "42"),
    ("unicode", REWRITTEN, "4\u200c2\u200d", "42"),
    ("unicode", REWRITTEN, "＄４２", "42"),
    ("unicode", REWRITTEN, "１，２３４", "1234"),
    ("unicode", REWRITTEN, "٤٫٥", "4.5"),
    ("unicode", REWRITTEN, "\u221242", "-42"),
    ("unicode", REWRITTEN, "42", "４２"),  # a ground truth written so, normalised the same way
    ("unicode", REWRITTEN, "\\frac{８４}{２}", "42"),
    ("unicode", WRONG, "４３", "42"),
    ("unicode", WRONG, "٤٣", "42"),
    ("unicode", WRONG, "४३", "42"),
    ("unicode", WRONG, "4\u200b3", "42"),
    ("unicode", WRONG, "４２０", "42"),
    ("unicode", WRONG, "𝟒.𝟐", "42"),
    ("unicode", WRONG, "４１ or ４２", "42"),
    ("unicode", WRONG, "4\u200b1 or 42", "42"),
    # Scientific notation.
    ("scientific", RIGHT, "42", "42"),
    ("scientific", REWRITTEN, "4.2e1", "42"),
    ("scientific", REWRITTEN, "4.2E+1", "42"),
    ("scientific", REWRITTEN, "420e-1", "42"),
    ("scientific", REWRITTEN, "4.2 × 10^1", "42"),
    ("scientific", REWRITTEN, "4.2 \\times 10^{1}", "42"),
    ("scientific", REWRITTEN, "4.2·10^1", "42"),
    ("scientific", REWRITTEN, "4.2 x 10^1", "42"),
    ("scientific", REWRITTEN, "4.2 \\cdot 10^{1}", "42"),
    ("scientific", REWRITTEN, "1e3", "1000"),
    ("scientific", REWRITTEN, "4.2 × 10¹", "42"),
    ("scientific", WRONG, "4.2e2", "42"),
    ("scientific", WRONG, "4.2 × 10^2", "42"),
    ("scientific", WRONG, "4.2", "42"),
    ("scientific", WRONG, "4.2 \\times 10^{0}", "42"),
    ("scientific", WRONG, "42e1", "42"),
    ("scientific", WRONG, "4.2e1 or 4.3e1", "42"),
    # Mixed numbers.
    ("mixed", RIGHT, "10.5", "10.5"),
    ("mixed", REWRITTEN, "10 1/2", "10.5"),
    ("mixed", REWRITTEN, "10½", "10.5"),
    ("mixed", REWRITTEN, "10 ½", "10.5"),
    ("mixed", REWRITTEN, "21/2", "10.5"),
    ("mixed", REWRITTEN, "\\frac{21}{2}", "10.5"),
    ("mixed", REWRITTEN, "$10 1/2$", "10.5"),
    ("mixed", REWRITTEN, "-10 1/2", "-10.5"),
    ("mixed", REWRITTEN, "½", "0.5"),
    ("mixed", WRONG, "10 1/3", "10.5"),
    ("mixed", WRONG, "10 3/2", "10.5"),
    ("mixed", WRONG, "1/2", "10.5"),
    ("mixed", WRONG, "10", "10.5"),
    ("mixed", WRONG, "10 or 10½", "10.5"),
    ("mixed", WRONG, "10⅓", "10.5"),
    # CJK units and punctuation after the number.
    ("cjk", RIGHT, "42", "42"),
    ("cjk", REWRITTEN, "42元", "42"),
    ("cjk", REWRITTEN, "42只", "42"),
    ("cjk", REWRITTEN, "42个", "42"),
    ("cjk", REWRITTEN, "42。", "42"),
    ("cjk", REWRITTEN, "42．", "42"),
    ("cjk", REWRITTEN, "４２元。", "42"),
    ("cjk", REWRITTEN, "42 元", "42"),
    ("cjk", REWRITTEN, "42、", "42"),
    ("cjk", REWRITTEN, "¥42", "42"),
    ("cjk", REWRITTEN, "42个苹果", "42"),
    ("cjk", WRONG, "43元", "42"),
    ("cjk", WRONG, "42元或43元", "42"),
    ("cjk", WRONG, "四十一或42", "42"),
    ("cjk", WRONG, "42两", "42"),
    ("cjk", WRONG, "4点2", "4.2"),
    ("cjk", WRONG, "四十二", "42"),  # CJK numerals alone are not read (as before)
    # CJK magnitudes change the value: scaled, never credited for the unscaled number.
    ("cjk-magnitude", RIGHT, "420000", "420000"),
    ("cjk-magnitude", REWRITTEN, "42万", "420000"),
    ("cjk-magnitude", REWRITTEN, "42萬", "420000"),
    ("cjk-magnitude", REWRITTEN, "4.2万", "42000"),
    ("cjk-magnitude", REWRITTEN, "4亿", "400000000"),
    ("cjk-magnitude", REWRITTEN, "3千", "3000"),
    ("cjk-magnitude", REWRITTEN, "5百", "500"),
    ("cjk-magnitude", REWRITTEN, "3千万", "30000000"),
    ("cjk-magnitude", REWRITTEN, "42万元", "420000"),
    ("cjk-magnitude", REWRITTEN, "420000", "42万"),  # the ground truth scaled the same way
    ("cjk-magnitude", WRONG, "42万", "42"),
    ("cjk-magnitude", WRONG, "4亿", "4"),
    ("cjk-magnitude", WRONG, "3千", "3"),
    ("cjk-magnitude", WRONG, "5百", "5"),
    ("cjk-magnitude", WRONG, "42", "42万"),
    ("cjk-magnitude", WRONG, "42万", "\\frac{84}{2}"),
    ("cjk-magnitude", WRONG, "两", "2"),
    # Units and currency around one number.
    ("units", RIGHT, "42", "42"),
    ("units", REWRITTEN, "$42", "42"),
    ("units", REWRITTEN, "42 dollars", "42"),
    ("units", REWRITTEN, "42 apples", "42"),
    ("units", REWRITTEN, "42%", "42"),
    ("units", REWRITTEN, "USD 42", "42"),
    ("units", REWRITTEN, "42 m²", "42"),
    ("units", REWRITTEN, "42 m^2", "42"),
    ("units", REWRITTEN, "42 \\text{ cm}^{3}", "42"),
    ("units", REWRITTEN, "1,234", "1234"),
    ("units", REWRITTEN, "1 234 567", "1234567"),
    ("units", REWRITTEN, "€42.00", "42"),
    ("units", WRONG, "$43", "42"),
    ("units", WRONG, "42 m²", "2"),
    ("units", WRONG, "1,234", "1"),
    ("units", WRONG, "1 234 567", "567"),
    ("units", WRONG, "42%", "4.2"),
    ("units", WRONG, "$42 or $43", "42"),
    ("units", WRONG, "0,042", "42"),
    ("units", WRONG, "0 042", "42"),
    # One LaTeX value: not a list of numbers, still math-verify's to grade.
    ("latex", RIGHT, "42", "42"),
    ("latex", REWRITTEN, "\\frac{84}{2}", "42"),
    ("latex", REWRITTEN, "\\dfrac{3}{4}", "0.75"),
    ("latex", REWRITTEN, "3/4", "0.75"),
    ("latex", REWRITTEN, "2^{10}", "1024"),
    ("latex", REWRITTEN, "\\boxed{\\frac{84}{2}}", "42"),
    ("latex", REWRITTEN, "x = 42", "42"),
    ("latex", REWRITTEN, "\\sqrt{1764}", "42"),
    ("latex", REWRITTEN, "3 \\times 14", "42"),
    ("latex", REWRITTEN, "10 \\frac{1}{2}", "10.5"),
    ("latex", WRONG, "\\frac{83}{2}", "42"),
    ("latex", WRONG, "\\frac{3}{4} or \\frac{1}{2}", "0.75"),
    ("latex", WRONG, "2^{10}", "2"),
    ("latex", WRONG, "\\frac{3}{4}, \\frac{1}{2}", "0.5"),
]

# (category, kind, reward fn, whole response, ground truth): the answer block itself is malformed.
RESPONSES = [
    ("tags", WRONG, "r1_zero", " x </think> <answer> <think> 42 </think> </answer>", "42"),
    ("tags", WRONG, "r1_zero", " x </think> <answer> <answer> 42 </answer>", "42"),
    ("tags", WRONG, "r1_zero", " x </think> <answer> 41 <answer> 42 </answer>", "42"),
    ("tags", WRONG, "r1_zero", " x </think> <answer> 42 </answer> </answer>", "42"),
    ("tags", WRONG, "r1_zero", " x </think> <answer> 42 </think> </answer>", "42"),
    ("tags", WRONG, "answer_tag", "<answer> <answer> 42 </answer>", "42"),
    ("tags", WRONG, "answer_tag", "<answer>41<answer>42</answer>", "42"),
    ("tags", WRONG, "answer_tag", "<answer> <think>42</think> </answer>", "42"),
    ("tags", WRONG, "question_only", "so \\boxed{<think>42</think>}", "42"),
    ("hedging", WRONG, "r1_zero", " x </think> <answer> \\boxed{41} or \\boxed{42} </answer>", "42"),
    ("hedging", WRONG, "answer_tag", "<answer>\\boxed{41} \\boxed{42}</answer>", "42"),
    ("hedging", REWRITTEN, "r1_zero", " x </think> <answer> The answer is \\boxed{42}. </answer>", "42"),
    ("hedging", REWRITTEN, "answer_tag", "<answer>\\boxed{42} apples</answer>", "42"),
    ("tags", REWRITTEN, "r1_zero", " x </think> <answer> 41 </answer> <answer> 42 </answer>", "42"),
    ("tags", REWRITTEN, "answer_tag", "<answer>41</answer> no: <answer>42</answer>", "42"),
]


def wrap(fn_name: str, answer: str) -> str:
    if fn_name == "r1_zero":
        return f" 6 x 7 is 42. </think> <answer> {answer} </answer>"
    if fn_name == "answer_tag":
        return f"6 x 7 is 42.\n<answer>{answer}</answer>"
    return f"6 x 7 is 42, so the answer is \\boxed{{{answer}}}."


FNS = ["r1_zero", "question_only", "answer_tag"]


def gradings():
    """Every (category, kind, reward fn, response, ground truth) of the table."""
    for category, kind, answer, gold in CASES:
        for fn_name in FNS:
            yield category, kind, fn_name, wrap(fn_name, answer), gold
    yield from RESPONSES


def agreement() -> dict[str, dict[str, list[int]]]:
    """{category: {kind: [agreeing, total]}} over every grading of the table."""
    counts: dict[str, dict[str, list[int]]] = {}
    for category, kind, fn_name, response, gold in gradings():
        scores = get_reward_fn(fn_name)(response, gold)
        expected = 0.0 if kind == WRONG else 1.0
        tally = counts.setdefault(category, {}).setdefault(kind, [0, 0])
        tally[0] += scores["reward"] == expected and scores["answer_reward"] == expected
        tally[1] += 1
    return counts


def format_agreement(counts: dict[str, dict[str, list[int]]]) -> str:
    names = {RIGHT: "right", REWRITTEN: "rewritten", WRONG: "wrong-rejected"}
    lines = []
    for category, kinds in counts.items():
        cells = [f"{names[k]} {kinds[k][0]}/{kinds[k][1]}" for k in (RIGHT, REWRITTEN, WRONG) if k in kinds]
        lines.append(f"  {category:14s} " + ", ".join(cells))
    totals = {k: [sum(c[k][i] for c in counts.values() if k in c) for i in (0, 1)] for k in names}
    lines.append("  " + "total".ljust(14) + " " + ", ".join(f"{names[k]} {a}/{n}" for k, (a, n) in totals.items()))
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def _defaults(default_grading):
    """Every test starts and ends with the default grading configuration and zeroed counts."""


def test_the_table_covers_every_category_and_kind():
    categories = {c for c, _, _, _ in CASES}
    assert categories == {
        "hedging", "computation", "tags", "unicode", "scientific", "mixed", "cjk", "cjk-magnitude", "units", "latex"
    }
    for category in categories:
        assert {k for c, k, _, _ in CASES if c == category} == {RIGHT, REWRITTEN, WRONG}, category


@pytest.mark.parametrize(
    "category, kind, fn_name, response, ground_truth",
    [pytest.param(*g, id=f"{g[0]}-{g[1]}-{g[2]}-{i}") for i, g in enumerate(gradings())],
)
def test_agreement(category, kind, fn_name, response, ground_truth):
    scores = get_reward_fn(fn_name)(response, ground_truth)
    expected = 0.0 if kind == WRONG else 1.0
    assert scores["reward"] == scores["answer_reward"] == expected
    assert scores["format_reward"] == 1.0  # a tag inside the answer costs the answer, not the format
    assert grading_stats()["timeouts"] == grading_stats()["errors"] == 0


@pytest.mark.parametrize(
    "answer",
    ["41 or 42", "first 7, then 42", "between 40 and 42", "either 41 or 42", "42 (or maybe 41)", "41 = 42",
     "<think> 42 </think>", "\\frac{82}{2} \\text{ or } \\frac{84}{2}"],
)
def test_hedged_and_tagged_answers_never_reach_math_verify(answer):
    assert grade_answer(answer, "42") is False
    assert grading_stats()["rejected"] == 1
    assert grading_stats()["slow_path"] == 0


def test_a_true_computation_is_graded_on_the_fast_path():
    assert grade_answer("6 \\times 7 = 42", "42") is True
    assert grading_stats()["fast_path"] == 1 and grading_stats()["slow_path"] == 0


def test_one_latex_value_is_not_a_list_of_numbers():
    # Evaluated exactly when this module can (\frac, ^, \times), else math-verify's (\sqrt).
    for answer in ["\\frac{84}{2}", "\\boxed{\\frac{84}{2}}", "x = 42", "\\sqrt{1764}"]:
        assert grade_answer(answer, "42") is True
    assert grade_answer("2^{10}", "1024") is True
    assert grading_stats()["rejected"] == 0
    assert grading_stats()["fast_path"] == 4 and grading_stats()["slow_path"] == 1
