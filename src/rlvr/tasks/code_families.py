"""The function families of the generated `code` task (rlvr.tasks.code): each family is a small Python function
with a plain-English spec, parameters drawn at random, and a reference solution whose outputs become the hidden
tests. Levels 1-3 take more families, with more parameters and edge cases.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

_WORDS = (
    "apple", "banana", "cherry", "kiwi", "lemon", "mango", "grape", "pear", "plum", "fig", "cat", "dog", "bird",
    "fish", "wolf", "bear", "tiger", "horse", "tree", "leaf", "rose", "moss", "river", "stone", "cloud", "rain",
    "snow", "sun", "moon", "star", "road", "bridge", "house", "door", "book", "pen", "cup", "table", "chair",
    "music", "level", "noon", "radar", "kayak", "civic", "eye", "ant", "owl", "egg", "ice", "umbrella", "orange",
    "idea", "ocean", "echo", "sky", "salt", "milk", "bread", "window",
)


_PALINDROMES = ("level", "noon", "radar", "kayak", "civic", "eye", "racecar", "abba", "madam", "refer", "a", "wow")


PARAMS = {
    "ints": ("nums", "numbers", "values", "xs", "lst", "data"),
    "str": ("s", "text", "sentence", "phrase", "line"),
    "word": ("s", "word", "text", "string", "token"),
    "words": ("words", "strings", "items", "names", "tokens"),
    "int": ("n", "num", "value", "number"),
}


PAIRS = (("xs", "ys"), ("a", "b"), ("first", "second"), ("left", "right"), ("p", "q"))


EMPTY = {"ints": [], "str": "", "word": "", "words": [], "int": 0}


FRAMES = (
    "Write a Python function `{sig}` that returns {text}.",
    "Write a function `{sig}` in Python that returns {text}.",
    "Implement the Python function `{sig}`: it returns {text}.",
    "Define `{sig}` in Python so that it returns {text}.",
    "Create a Python function `{sig}` which returns {text}.",
    "Write `{sig}`, a Python function that returns {text}.",
)


def _ints(rng: random.Random, lo: int = -5, hi: int = 15, min_len: int = 2, max_len: int = 7) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(min_len, max_len))]


def _phrase(rng: random.Random, max_words: int = 3) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, max_words)))


def draw(kind: str, rng: random.Random):
    if kind == "ints":
        return _ints(rng)
    if kind == "str":
        return _phrase(rng)
    if kind == "word":
        return rng.choice(_WORDS)
    if kind == "words":
        return [rng.choice(_WORDS) for _ in range(rng.randint(1, 6))]
    if kind == "int":
        return rng.randint(1, 99)
    raise AssertionError(kind)


@dataclasses.dataclass(frozen=True)
class Family:
    """One kind of function. `text` (what it returns) and `body` (the reference solution's body) are
    str.format templates over the argument names {a}, {b} and the constants `consts(rng)` draws; so are the
    function-name synonyms `names`."""

    key: str
    level: int
    names: tuple[str, ...]
    args: tuple[str, ...]  # argument kinds, keys of PARAMS
    text: str
    body: str
    consts: Callable[[random.Random], dict] = lambda rng: {}
    edge: bool = True  # empty inputs are fair tests
    draw: Callable[[random.Random, dict], tuple] | None = None  # custom inputs: (rng, consts) -> arguments


def _k(lo: int, hi: int, name: str = "k") -> Callable[[random.Random], dict]:
    return lambda rng: {name: rng.randint(lo, hi)}


def _char(pool: str, name: str = "c") -> Callable[[random.Random], dict]:
    return lambda rng: {name: rng.choice(pool)}


def _mixed_case(rng: random.Random, consts: dict) -> tuple:
    return ("".join(c.upper() if rng.random() < 0.3 else c for c in _phrase(rng)),)


def _palindrome_or_not(rng: random.Random, consts: dict) -> tuple:
    return (rng.choice(_PALINDROMES) if rng.random() < 0.5 else rng.choice(_WORDS),)


def _multiple_or_not(rng: random.Random, consts: dict) -> tuple:
    return (consts["k"] * rng.randint(2, 12) if rng.random() < 0.5 else rng.randint(10, 99),)


def _same_length_pair(rng: random.Random, consts: dict) -> tuple:
    n = rng.randint(0, 5)
    return [rng.randint(-5, 12) for _ in range(n)], [rng.randint(-5, 12) for _ in range(n)]


def _repeats(rng: random.Random, consts: dict) -> tuple:
    return (_ints(rng, 0, 6, 1, 8),)


def _repeated_words(rng: random.Random, consts: dict) -> tuple:
    pool = rng.sample(_WORDS, 3)
    return ([rng.choice(pool) for _ in range(rng.randint(1, 6))],)


def _labels(rng: random.Random) -> dict:
    p, q = rng.choice(((2, 3), (3, 5), (2, 5), (3, 4), (2, 7)))
    w1, w2 = rng.choice((("fizz", "buzz"), ("foo", "bar"), ("ping", "pong")))
    return {"p": p, "q": q, "w1": w1, "w2": w2, "both": w1 + w2}


def _fma(rng: random.Random) -> dict:
    """Filter then map, for the aggregating families: e.g. the squares of the odd numbers."""
    t = rng.randint(0, 8)
    cond, f_text, f_name = rng.choice((
        ("x % 2 == 0", "even numbers", "evens"), ("x % 2 != 0", "odd numbers", "odds"),
        ("x > 0", "positive numbers", "positives"), ("x < 0", "negative numbers", "negatives"),
        (f"x > {t}", f"numbers greater than {t}", f"above_{t}"), (f"x < {t}", f"numbers less than {t}", f"below_{t}"),
    ))
    k = rng.randint(2, 5)
    expr, m_text, m_name = rng.choice((
        ("x * x", f"the squares of the {f_text}", "squares"),
        (f"x * {k}", f"the {f_text} each multiplied by {k}", "scaled"),
        ("abs(x)", f"the absolute values of the {f_text}", "abs"),
    ))
    return {"cond": cond, "expr": expr, "m_text": m_text, "f_name": f_name, "m_name": m_name}


# The families of each level. A body is unindented; "{{" and "}}" are literal braces.
FAMILIES: tuple[Family, ...] = (
    # level 1: one expression
    Family("reverse", 1, ("reverse_string", "reverse_text", "flip_string", "backwards"), ("str",),
            "the string `{a}` reversed", "return {a}[::-1]"),
    Family("count_char", 1, ("count_char", "char_count", "count_letter", "letter_count"), ("str",),
            "how many times the character {c!r} appears in the string `{a}`", "return {a}.count({c!r})",
            _char("aeinorst")),
    Family("add_k", 1, ("add_k", "add_to_each", "shift_all", "increase_all"), ("ints",),
            "a new list with {k} added to each element of the list `{a}`", "return [x + {k} for x in {a}]",
            _k(1, 9)),
    Family("times_k", 1, ("multiply_all", "scale_list", "times_k", "multiply_each"), ("ints",),
            "a new list with each element of the list `{a}` multiplied by {k}", "return [x * {k} for x in {a}]",
            _k(2, 6)),
    Family("largest", 1, ("find_max", "largest", "max_value", "biggest"), ("ints",),
            "the largest number in the non-empty list `{a}`", "return max({a})", edge=False),
    Family("smallest", 1, ("find_min", "smallest", "min_value", "lowest"), ("ints",),
            "the smallest number in the non-empty list `{a}`", "return min({a})", edge=False),
    Family("total", 1, ("total", "list_sum", "sum_list", "add_all"), ("ints",),
            "the sum of the numbers in the list `{a}`", "return sum({a})"),
    Family("upper", 1, ("shout", "to_upper", "make_upper", "upper_case"), ("str",),
            "the string `{a}` with every letter in upper case", "return {a}.upper()"),
    Family("capitalize", 1, ("capitalize_words", "title_words", "cap_words"), ("str",),
            "the string `{a}` with the first letter of each word capitalised (words are separated by single "
            "spaces)", "return ' '.join(w.capitalize() for w in {a}.split(' '))"),
    Family("word_count", 1, ("count_words", "word_count", "num_words"), ("str",),
            "the number of words in the string `{a}` (words are separated by spaces)", "return len({a}.split())"),
    Family("prefix", 1, ("first_k", "prefix", "head", "take_first"), ("word",),
            "the first {k} characters of the string `{a}` (all of it if it is shorter)", "return {a}[:{k}]",
            _k(1, 4)),
    Family("last_k", 1, ("last_k", "tail", "take_last", "last_items"), ("ints",),
            "the last {k} elements of the list `{a}` (all of it if it is shorter)", "return {a}[-{k}:]", _k(1, 4)),
    Family("palindrome", 1, ("is_palindrome", "palindrome", "reads_same"), ("word",),
            "True if the string `{a}` reads the same forwards and backwards, otherwise False",
            "return {a} == {a}[::-1]", draw=_palindrome_or_not),
    Family("span", 1, ("span", "value_range", "spread", "max_minus_min"), ("ints",),
            "the difference between the largest and the smallest number in the non-empty list `{a}`",
            "return max({a}) - min({a})", edge=False),
    Family("divisible", 1, ("is_divisible", "divisible_by_k", "is_multiple"), ("int",),
            "True if the integer `{a}` is divisible by {k}, otherwise False", "return {a} % {k} == 0",
            _k(2, 9), draw=_multiple_or_not),
    Family("repeat", 1, ("repeat", "repeat_string", "echo"), ("word",),
            "the string `{a}` repeated {k} times", "return {a} * {k}", _k(2, 4)),
    Family("replace", 1, ("replace_char", "swap_letter", "substitute"), ("str",),
            "the string `{a}` with every {c!r} replaced by {d!r}", "return {a}.replace({c!r}, {d!r})",
            lambda rng: dict(zip("cd", rng.sample("aeiorstn", 2)))),
    Family("absolute", 1, ("absolute_values", "abs_all", "magnitudes"), ("ints",),
            "a new list with the absolute value of each number in the list `{a}`", "return [abs(x) for x in {a}]"),
    Family("join", 1, ("join_words", "glue", "combine_strings"), ("words",),
            "the strings in the list `{a}` joined into one string with {sep!r} between them",
            "return {sep!r}.join({a})", lambda rng: {"sep": rng.choice(("-", ", ", "_", " ", "+"))}),
    # level 2: a loop or a comprehension with a condition, or two steps
    Family("sum_evens", 2, ("sum_evens", "sum_of_evens", "even_sum", "add_evens"), ("ints",),
            "the sum of the even numbers in the list `{a}`", "return sum(x for x in {a} if x % 2 == 0)"),
    Family("sum_odds", 2, ("sum_odds", "sum_of_odds", "odd_sum", "add_odds"), ("ints",),
            "the sum of the odd numbers in the list `{a}`", "return sum(x for x in {a} if x % 2 != 0)"),
    Family("longer_than", 2, ("long_words", "longer_than", "filter_long", "keep_long"), ("words",),
            "a list of the strings in the list `{a}` that are longer than {k} characters, in their original order",
            "return [w for w in {a} if len(w) > {k}]", _k(2, 5)),
    Family("count_above", 2, ("count_above", "count_greater", "num_above"), ("ints",),
            "how many numbers in the list `{a}` are greater than {t}", "return len([x for x in {a} if x > {t}])",
            _k(0, 10, "t")),
    Family("remove_vowels", 2, ("remove_vowels", "strip_vowels", "no_vowels", "drop_vowels"), ("str",),
            "the string `{a}` with all the vowels (a, e, i, o, u) removed",
            "return ''.join(c for c in {a} if c not in 'aeiou')"),
    Family("count_vowels", 2, ("count_vowels", "vowel_count", "num_vowels"), ("str",),
            "how many vowels (a, e, i, o, u) the string `{a}` contains",
            "return len([c for c in {a} if c in 'aeiou'])"),
    Family("running_sum", 2, ("running_sum", "cumulative_sum", "prefix_sums", "running_total"), ("ints",),
            "a list of the running totals of the list `{a}`: element i is the sum of the first i + 1 numbers",
            "total = 0\nresult = []\nfor x in {a}:\n    total += x\n    result.append(total)\nreturn result"),
    Family("pair_sum", 2, ("add_lists", "pairwise_sum", "sum_pairs"), ("ints", "ints"),
            "a list whose element i is `{a}[i] + {b}[i]`, for two lists `{a}` and `{b}` of the same length",
            "return [x + y for x, y in zip({a}, {b})]", draw=_same_length_pair),
    Family("pair_max", 2, ("pairwise_max", "larger_of_each", "max_pairs"), ("ints", "ints"),
            "a list whose element i is the larger of `{a}[i]` and `{b}[i]`, for two lists `{a}` and `{b}` of the "
            "same length", "return [max(x, y) for x, y in zip({a}, {b})]", draw=_same_length_pair),
    Family("differences", 2, ("differences", "diffs", "gaps", "steps_between"), ("ints",),
            "a list of the differences between neighbouring numbers in the list `{a}`: element i is "
            "`{a}[i + 1] - {a}[i]`", "return [{a}[i + 1] - {a}[i] for i in range(len({a}) - 1)]"),
    Family("at_least", 2, ("keep_above", "filter_above", "at_least"), ("ints",),
            "a list of the numbers in the list `{a}` that are at least {t}, in their original order",
            "return [x for x in {a} if x >= {t}]", _k(0, 10, "t")),
    Family("first_above", 2, ("first_above", "index_above", "find_first_above"), ("ints",),
            "the index of the first number in the list `{a}` that is greater than {t}, or -1 if there is none",
            "for i, x in enumerate({a}):\n    if x > {t}:\n        return i\nreturn -1", _k(3, 12, "t")),
    Family("unique", 2, ("unique", "dedupe", "remove_duplicates", "distinct"), ("ints",),
            "the list `{a}` without repeated numbers, keeping the first occurrence of each in order",
            "result = []\nfor x in {a}:\n    if x not in result:\n        result.append(x)\nreturn result",
            draw=_repeats),
    Family("starting_with", 2, ("starting_with", "words_starting_with", "filter_initial"), ("words",),
            "a list of the strings in the list `{a}` that start with the letter {c!r}, in their original order",
            "return [w for w in {a} if w.startswith({c!r})]", _char("bcmrst")),
    Family("reverse_words", 2, ("reverse_words", "flip_words", "mirror_words"), ("str",),
            "the string `{a}` with each word reversed and the words kept in order (words are separated by "
            "single spaces)", "return ' '.join(w[::-1] for w in {a}.split(' '))"),
    Family("clamp", 2, ("clamp_all", "clip_values", "limit_values"), ("ints",),
            "a new list with each number in the list `{a}` limited to the range {lo} to {hi}: numbers below {lo} "
            "become {lo} and numbers above {hi} become {hi}", "return [min(max(x, {lo}), {hi}) for x in {a}]",
            lambda rng: (lambda lo: {"lo": lo, "hi": lo + rng.randint(3, 8)})(rng.randint(0, 5))),
    Family("count_upper", 2, ("count_upper", "count_capitals", "num_uppercase"), ("str",),
            "how many upper-case letters the string `{a}` contains", "return len([c for c in {a} if c.isupper()])",
            draw=_mixed_case),
    Family("zero_negatives", 2, ("zero_negatives", "clip_negatives", "no_negatives"), ("ints",),
            "a new list in which every negative number of the list `{a}` is replaced by 0",
            "return [x if x >= 0 else 0 for x in {a}]"),
    Family("product", 2, ("product", "list_product", "multiply_together"), ("ints",),
            "the product of the numbers in the list `{a}` (1 for an empty list)",
            "result = 1\nfor x in {a}:\n    result *= x\nreturn result"),
    Family("alternating", 2, ("alternating_sum", "even_minus_odd", "zigzag_sum"), ("ints",),
            "the sum of the elements of the list `{a}` at even positions (0, 2, 4, ...) minus the sum of those at "
            "odd positions", "return sum({a}[0::2]) - sum({a}[1::2])"),
    # level 3: combinations
    Family("filter_map_sum", 3, ("sum_{m_name}_{f_name}", "sum_of_{m_name}_{f_name}"), ("ints",),
            "the sum of {m_text} in the list `{a}` (0 if there are none)",
            "total = 0\nfor x in {a}:\n    if {cond}:\n        total += {expr}\nreturn total", _fma),
    Family("filter_map_max", 3, ("max_{m_name}_{f_name}", "largest_{m_name}_{f_name}"), ("ints",),
            "the largest of {m_text} in the list `{a}`, or 0 if there are none",
            "values = [{expr} for x in {a} if {cond}]\nif not values:\n    return 0\nreturn max(values)", _fma),
    Family("char_counts", 3, ("char_counts", "letter_frequencies", "count_chars", "char_histogram"), ("word",),
            "a dictionary mapping each character of the string `{a}` to how many times it appears",
            "counts = {{}}\nfor c in {a}:\n    counts[c] = counts.get(c, 0) + 1\nreturn counts"),
    Family("letter_counts", 3, ("letter_counts", "count_letters", "letter_histogram"), ("str",),
            "a dictionary mapping each character of the string `{a}` except spaces to how many times it appears",
            "counts = {{}}\nfor c in {a}:\n    if c != ' ':\n        counts[c] = counts.get(c, 0) + 1\nreturn counts"),
    Family("word_counts", 3, ("word_counts", "count_each_word", "word_frequencies"), ("words",),
            "a dictionary mapping each string in the list `{a}` to how many times it appears in the list",
            "counts = {{}}\nfor w in {a}:\n    counts[w] = counts.get(w, 0) + 1\nreturn counts", draw=_repeated_words),
    Family("word_lengths", 3, ("word_lengths", "lengths_of_long_words", "long_word_sizes"), ("words",),
            "a dictionary mapping each string in the list `{a}` that is longer than {k} characters to its length",
            "return {{w: len(w) for w in {a} if len(w) > {k}}}", _k(2, 5)),
    Family("labels", 3, ("label_numbers", "fizz_buzz", "tag_numbers"), ("ints",),
            "a list with one entry per number of the list `{a}`: {both!r} if the number is divisible by both {p} "
            "and {q}, {w1!r} if it is divisible only by {p}, {w2!r} if only by {q}, otherwise the number itself",
            "result = []\nfor x in {a}:\n    if x % {p} == 0 and x % {q} == 0:\n        result.append({both!r})\n"
            "    elif x % {p} == 0:\n        result.append({w1!r})\n"
            "    elif x % {q} == 0:\n        result.append({w2!r})\n"
            "    else:\n        result.append(x)\nreturn result", _labels),
    Family("longest", 3, ("longest_word", "longest", "find_longest"), ("words",),
            "the longest string in the list `{a}` (the first one if several are equally long), or '' for an empty "
            "list", "best = ''\nfor w in {a}:\n    if len(w) > len(best):\n        best = w\nreturn best"),
    Family("sign_counts", 3, ("sign_counts", "count_signs", "classify_numbers"), ("ints",),
            "a dictionary with the keys 'positive', 'negative' and 'zero' counting the numbers of each kind in "
            "the list `{a}`", "counts = {{'positive': 0, 'negative': 0, 'zero': 0}}\nfor x in {a}:\n    if x > 0:\n"
            "        counts['positive'] += 1\n    elif x < 0:\n        counts['negative'] += 1\n    else:\n"
            "        counts['zero'] += 1\nreturn counts",
            draw=lambda rng, consts: (_ints(rng, -3, 3, 1, 8),)),
    Family("second_largest", 3, ("second_largest", "runner_up", "second_biggest"), ("ints",),
            "the second largest distinct number in the list `{a}`, or None if there are fewer than two distinct "
            "numbers", "values = sorted(set({a}))\nif len(values) < 2:\n    return None\nreturn values[-2]",
            draw=lambda rng, consts: (_ints(rng, 0, 9, 1, 6),)),
    Family("vowel_words", 3, ("count_vowel_words", "long_vowel_words", "vowel_start_count"), ("words",),
            "how many strings in the list `{a}` are longer than {k} characters and start with a vowel "
            "(a, e, i, o, u)", "return len([w for w in {a} if len(w) > {k} and w[0] in 'aeiou'])", _k(2, 4)),
    Family("group_initial", 3, ("group_by_initial", "group_by_first_letter", "bucket_words"), ("words",),
            "a dictionary mapping each first letter to the list of the strings in the list `{a}` that start "
            "with it, in their original order",
            "groups = {{}}\nfor w in {a}:\n    if w[0] not in groups:\n        groups[w[0]] = []\n"
            "    groups[w[0]].append(w)\nreturn groups"),
    Family("caesar", 3, ("caesar", "shift_letters", "rotate_letters"), ("str",),
            "the string `{a}` with each lower-case letter moved {k} places forward in the alphabet, wrapping "
            "around from 'z' to 'a', and every other character unchanged",
            "result = ''\nfor c in {a}:\n    if 'a' <= c <= 'z':\n"
            "        result += chr((ord(c) - ord('a') + {k}) % 26 + ord('a'))\n    else:\n        result += c\n"
            "return result", _k(2, 25)),
    Family("count_in_range", 3, ("count_between", "count_in_range", "between_count"), ("ints",),
            "how many numbers in the list `{a}` are even and between {lo} and {hi} inclusive",
            "count = 0\nfor x in {a}:\n    if {lo} <= x <= {hi} and x % 2 == 0:\n        count += 1\nreturn count",
            lambda rng: (lambda lo: {"lo": lo, "hi": lo + rng.randint(4, 10)})(rng.randint(-2, 5))),
)
