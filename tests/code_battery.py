"""The battery of issue 64: right and wrong programs in the styles real code data sets test with, each graded by
rlvr and by the real runner (pytest, unittest, the script itself, the program on stdin), which must agree.

Standard library and rlvr only: `tests/test_code_battery.py` grades it in its own process (as root) and here, as
a script, in a Debian Python started with `setpriv --reuid=65534` (`python3 code_battery.py grade OUT.json`).
The real runners run in `real_verdicts` (subprocesses, one per runner for all its files where it can).

A case: its name, the program, the tests (sources, as a code data set holds them) or stdin/stdout pairs, the
entry point, and whether it is right. Test files import the program as `solution`, or (scripts, HumanEval's
check) use its names as a file that follows the program would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    program: str
    tests: tuple = ()  # test sources
    entry: str | None = None
    right: bool = True
    stdio: tuple = ()  # (stdin, stdout) pairs
    compare: str = "whitespace"
    needs: str = ""  # a package the runtime must have ("numpy")


def _d(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


def case(name, program, tests, entry=None, right=True, needs=""):
    return Case(name, _d(program), tuple(_d(t) for t in ([tests] if isinstance(tests, str) else tests)), entry, right,
                needs=needs)


def stdio(name, program, pairs, compare="whitespace", right=True):
    return Case(name, _d(program), (), None, right, tuple(pairs), compare)


COUNTS = """
    from collections import Counter
    def char_counts(s):
        return Counter(s)
    def word_counts(text):
        return Counter(text.split())
"""
GROUPS = """
    from collections import defaultdict
    def group_by_initial(words):
        out = defaultdict(list)
        for w in words:
            out[w[0]].append(w)
        return out
"""


def cases() -> list[Case]:
    return [*_values(), *_scripts(), *_pytest(), *_unittest(), *_environment(), *_stdio()]


def _values() -> list[Case]:
    return [
        case("counter", COUNTS, ["assert char_counts('banana') == {'b': 1, 'a': 3, 'n': 2}",
                                 "assert char_counts('aab').most_common(1) == [('a', 2)]",
                                 "assert char_counts('')['z'] == 0"], "char_counts"),
        case("counter_words", COUNTS, "assert word_counts('a b a') == {'a': 2, 'b': 1}", "word_counts"),
        case("defaultdict", GROUPS, ["assert group_by_initial(['ant', 'bee', 'ape']) == {'a': ['ant', 'ape'], 'b': ['bee']}",
                                     "g = group_by_initial([])\nassert g['x'] == [] and dict(g) == {'x': []}"],
             "group_by_initial"),
        case("ordereddict", """
            from collections import OrderedDict
            def first_seen(xs):
                out = OrderedDict()
                for x in xs:
                    out.setdefault(x, len(out))
                return out
            """, ["from collections import OrderedDict\nassert first_seen('bab') == OrderedDict([('b', 0), ('a', 1)])",
                  "assert list(first_seen('cab').items())[0] == ('c', 0)"], "first_seen"),
        case("namedtuple", """
            from collections import namedtuple
            Point = namedtuple("Point", "x y")
            def mid(a, b):
                return Point((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)
            """, ["p = mid((0, 0), (2, 4))\nassert p == (1, 2) and p.x == 1 and p.y == 2",
                  "from solution import Point\nassert mid((0, 0), (0, 0)) == Point(0, 0)"], "mid"),
        case("fraction", """
            from fractions import Fraction
            def ratio(a, b):
                return Fraction(a, b)
            """, ["from fractions import Fraction\nassert ratio(2, 4) == Fraction(1, 2) and ratio(1, 2) == 0.5"], "ratio"),
        case("decimal", """
            from decimal import Decimal
            def add(a, b):
                return Decimal(a) + Decimal(b)
            """, "from decimal import Decimal\nassert add('0.1', '0.2') == Decimal('0.3')", "add"),
        case("complex_bytes_range", """
            def parts(n):
                return complex(n, -n), bytes(range(n)), bytearray(b'x' * n), range(n)
            """, "c, b, ba, r = parts(3)\nassert c == 3 - 3j and b == b'\\x00\\x01\\x02' and ba == b'xxx' and r == range(3)",
             "parts"),
        case("dict_views", """
            def keys_of(d):
                return d.keys()
            def values_of(d):
                return d.values()
            """, ["assert keys_of({'a': 1, 'b': 2}) == {'a', 'b'}", "assert sorted(values_of({'a': 2, 'b': 1})) == [1, 2]"],
             "keys_of"),
        case("deque", """
            from collections import deque
            def rotated(xs, k):
                d = deque(xs)
                d.rotate(k)
                return d
            """, "from collections import deque\nassert rotated([1, 2, 3], 1) == deque([3, 1, 2])", "rotated"),
        case("generator", """
            def evens(n):
                for i in range(n):
                    if i % 2 == 0:
                        yield i
            """, ["g = evens(7)\nassert next(g) == 0 and next(g) == 2\nassert list(g) == [4, 6]",
                  "assert sum(evens(10)) == 20 and list(evens(0)) == []"], "evens"),
        case("iterators", """
            def pairs(a, b):
                return zip(a, b)
            def doubled(xs):
                return map(lambda x: 2 * x, xs)
            """, "assert list(pairs('ab', [1, 2])) == [('a', 1), ('b', 2)] and list(doubled([1, 2])) == [2, 4]",
             "pairs"),
        case("frozenset_of_tuples", """
            def edges(graph):
                return frozenset((a, b) for a, nbrs in graph.items() for b in nbrs)
            """, "assert edges({1: [2], 2: [1]}) == {(1, 2), (2, 1)}", "edges"),
        case("str_subclass", """
            class Name(str):
                pass
            def name(s):
                return Name(s.title())
            """, "assert name('ada lovelace') == 'Ada Lovelace'", "name"),
        case("counter_wrong", COUNTS.replace("return Counter(s)", "return Counter(set(s))"),
             "assert char_counts('banana') == {'b': 1, 'a': 3, 'n': 2}", "char_counts", right=False),
        case("defaultdict_wrong", GROUPS.replace("out[w[0]].append(w)", "out[w[0]] = [w]"),
             "assert group_by_initial(['ant', 'bee', 'ape']) == {'a': ['ant', 'ape'], 'b': ['bee']}",
             "group_by_initial", right=False),
        case("fraction_wrong", "def ratio(a, b):\n    return a // b",
             "from fractions import Fraction\nassert ratio(1, 2) == Fraction(1, 2)", "ratio", right=False),
        case("generator_wrong", "def evens(n):\n    yield from range(0, n, 3)", "assert list(evens(7)) == [0, 2, 4, 6]",
             "evens", right=False),
    ]


def _scripts() -> list[Case]:
    return [
        case("mbpp_asserts", "def similar(a, b):\n    return tuple(sorted(set(a) & set(b)))",
             ["assert similar((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)", "assert similar((1, 2), (3,)) == ()"], "similar"),
        case("mbpp_math_import", "import math\ndef hyp(a, b):\n    return math.sqrt(a * a + b * b)",
             "assert math.isclose(hyp(3, 4), 5.0)", "hyp"),
        case("humaneval_check", "def add(x, y):\n    return x + y",
             "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0", "add"),
        case("in_place_nested_rows", """
            def zero_negatives(rows):
                for row in rows:
                    for i, v in enumerate(row):
                        if v < 0:
                            row[i] = 0
            """, "r0, r1 = [1, -2], [-3, 4]\nrows = [r0, r1]\nassert zero_negatives(rows) is None\n"
                 "assert r0 == [1, 0] and r1 == [0, 4] and rows[0] is r0", "zero_negatives"),
        case("exception_subclass", """
            class InsufficientFunds(ValueError):
                pass
            def withdraw(balance, amount):
                if amount > balance:
                    raise InsufficientFunds(f"short by {amount - balance}")
                return balance - amount
            """, "try:\n    withdraw(1, 5)\nexcept ValueError as e:\n    assert str(e) == 'short by 4'\nelse:\n"
                 "    assert False\nassert withdraw(5, 1) == 4", "withdraw"),
        case("many_calls", "def inc(x):\n    return x + 1", "for i in range(150000):\n    assert inc(i) == i + 1", "inc"),
        case("mbpp_strings", "def reverse_words(s):\n    return ' '.join(reversed(s.split()))",
             ["assert reverse_words('python program') == 'program python'", "assert reverse_words('') == ''"],
             "reverse_words"),
        case("mbpp_recursion", "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
             ["assert fib(10) == 55", "assert [fib(i) for i in range(6)] == [0, 1, 1, 2, 3, 5]"], "fib"),
        case("generator_argument", "def total(xs):\n    return sum(xs)",
             ["assert total(x * x for x in range(4)) == 14", "assert total(iter([1, 2])) == 3"], "total"),
        case("mbpp_wrong", "def similar(a, b):\n    return tuple(set(a) | set(b))",
             "assert similar((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)", "similar", right=False),
        case("humaneval_wrong", "def add(x, y):\n    return x - y",
             "def check(candidate):\n    assert candidate(2, 3) == 5", "add", right=False),
        case("in_place_wrong", """
            def zero_negatives(rows):
                rows[:] = [[max(v, 0) for v in row] for row in rows]
            """, "r0 = [1, -2]\nrows = [r0]\nzero_negatives(rows)\nassert r0 == [1, 0]", "zero_negatives", right=False),
        case("many_calls_wrong", "def inc(x):\n    return x + 1 if x < 149999 else x",
             "for i in range(150000):\n    assert inc(i) == i + 1", "inc", right=False),
    ]


def _pytest() -> list[Case]:
    return [
        case("pytest_functions", "def add(a, b):\n    return a + b",
             "from solution import add\ndef test_small():\n    assert add(1, 2) == 3\ndef test_negative():\n"
             "    assert add(-1, -1) == -2", "add"),
        case("pytest_parametrize", "def is_even(n):\n    return n % 2 == 0", """
            import pytest
            from solution import is_even
            @pytest.mark.parametrize("n, want", [(0, True), (1, False), (10, True), (7, False)])
            def test_even(n, want):
                assert is_even(n) is want
            """, "is_even"),
        case("pytest_fixtures", """
            class Stack:
                def __init__(self):
                    self.items = []
                def push(self, x):
                    self.items.append(x)
                def pop(self):
                    return self.items.pop()
                def __len__(self):
                    return len(self.items)
            """, """
            import pytest
            from solution import Stack
            @pytest.fixture
            def full():
                s = Stack()
                for x in (1, 2, 3):
                    s.push(x)
                yield s
                assert len(s) <= 3
            @pytest.fixture(scope="module")
            def empty():
                return Stack()
            def test_pop(full):
                assert full.pop() == 3 and len(full) == 2
            def test_empty(empty):
                assert len(empty) == 0 and not empty
            def test_raises(empty):
                with pytest.raises(IndexError):
                    empty.pop()
            """, "Stack"),
        case("pytest_approx_raises", """
            class NegativeError(ValueError):
                pass
            def root(x):
                if x < 0:
                    raise NegativeError(f"negative: {x}")
                return x ** 0.5
            """, """
            import pytest
            from solution import root, NegativeError
            def test_value():
                assert root(2) == pytest.approx(1.41421356)
            def test_raises_own_class():
                with pytest.raises(NegativeError, match="negative: -1"):
                    root(-1)
            def test_raises_base():
                with pytest.raises(ValueError):
                    root(-4)
            """, "root"),
        case("pytest_xunit_setup", "COUNT = []\ndef bump():\n    COUNT.append(1)\n    return len(COUNT)", """
            from solution import bump
            state = {}
            def setup_module(module):
                state["module"] = True
            def teardown_module(module):
                state.clear()
            def setup_function(function):
                state["function"] = function.__name__
            def test_one():
                assert state == {"module": True, "function": "test_one"} and bump() >= 1
            class TestMethods:
                def setup_method(self, method):
                    self.base = bump()
                def teardown_method(self, method):
                    self.base = None
                def test_two(self):
                    assert bump() == self.base + 1
            """, "bump"),
        case("pytest_marks", "def div(a, b):\n    return a / b", """
            import sys
            import pytest
            from solution import div
            @pytest.mark.skip(reason="not today")
            def test_skipped():
                assert div(1, 0) == 0
            @pytest.mark.skipif(sys.version_info < (3, 0), reason="old")
            def test_skipif():
                assert div(4, 2) == 2
            @pytest.mark.xfail(raises=ZeroDivisionError)
            def test_xfail():
                div(1, 0)
            def test_zero():
                with pytest.raises(ZeroDivisionError):
                    div(1, 0)
            """, "div"),
        case("kodcode_row", "def fizz(n):\n    return 'Fizz' if n % 3 == 0 else str(n)", """
            import pytest
            from solution import *
            def test_fizz():
                assert fizz(3) == 'Fizz'
            def test_number():
                assert fizz(4) == '4'
            def test_zero():
                assert fizz(0) == 'Fizz'
            """, "fizz"),
        case("pytest_yield_fixture_tmp_path", "def count_lines(path):\n    with open(path) as f:\n        return len(f.read().splitlines())",
             """
            import pytest
            from solution import count_lines
            @pytest.fixture
            def text_file(tmp_path):
                path = tmp_path / "a.txt"
                path.write_text("x\\ny\\nz\\n")
                yield str(path)
            def test_lines(text_file):
                assert count_lines(text_file) == 3
            """, "count_lines"),
        case("pytest_test_classes_and_callbacks", """
            def apply_all(fns, x):
                return [f(x) for f in fns]
            def depth(node):
                return 0 if node is None else 1 + max(depth(node.left), depth(node.right))
            """, """
            from solution import apply_all, depth
            class Node:
                def __init__(self, left=None, right=None):
                    self.left, self.right = left, right
            class TestCallbacks:
                def test_lambdas(self):
                    assert apply_all([lambda v: v + 1, str, abs], -2) == [-1, '-2', 2]
                def test_tree(self):
                    assert depth(Node(Node(Node()), Node())) == 3
            """, "apply_all"),
        case("pytest_linked_list_of_the_tests", """
            def reverse(head):
                prev = None
                while head is not None:
                    head.next, prev, head = prev, head, head.next
                return prev
            """, """
            from solution import reverse
            class ListNode:
                def __init__(self, val, next=None):
                    self.val, self.next = val, next
            def values(node):
                out = []
                while node:
                    out.append(node.val)
                    node = node.next
                return out
            def test_reverse():
                head = ListNode(1, ListNode(2, ListNode(3)))
                assert values(reverse(head)) == [3, 2, 1] and head.next is None
            """, "reverse"),
        case("pytest_system_exit", "import sys\ndef main(argv):\n    if not argv:\n        sys.exit(2)\n    return len(argv)", """
            import pytest
            from solution import main
            def test_exit():
                with pytest.raises(SystemExit) as e:
                    main([])
                assert e.value.code == 2
            def test_count():
                assert main(['a', 'b']) == 2
            """, "main"),
        case("pytest_warns_and_caplog", """
            import logging
            import warnings
            log = logging.getLogger("solution")
            def old_api(x):
                warnings.warn("old_api is deprecated", DeprecationWarning)
                log.info("called with %s", x)
                return x
            """, """
            import logging
            import pytest
            from solution import old_api
            def test_warns():
                with pytest.warns(DeprecationWarning, match="deprecated"):
                    assert old_api(3) == 3
            def test_logs(caplog):
                caplog.set_level(logging.INFO)
                old_api(5)
                assert "called with 5" in caplog.text
            """, "old_api"),
        case("pytest_capfd", "def shout(s):\n    print(s.upper())", """
            from solution import shout
            def test_fd(capfd):
                shout('hi')
                assert capfd.readouterr().out == 'HI\\n'
            """, "shout"),
        case("pytest_isinstance_of_the_programs_classes", """
            class Shape:
                def area(self):
                    raise NotImplementedError
            class Square(Shape):
                def __init__(self, side):
                    self.side = side
                def area(self):
                    return self.side ** 2
            """, """
            from solution import Shape, Square
            def test_types():
                s = Square(3)
                assert isinstance(s, Square) and isinstance(s, Shape) and issubclass(Square, Shape)
                assert not isinstance(5, Shape) and s.area() == 9
            """, "Square"),
        case("pytest_parametrize_wrong", "def is_even(n):\n    return n % 2 == 0 or n == 7", """
            import pytest
            from solution import is_even
            @pytest.mark.parametrize("n, want", [(0, True), (1, False), (7, False)])
            def test_even(n, want):
                assert is_even(n) is want
            """, "is_even", right=False),
        case("pytest_raises_wrong_class", "def root(x):\n    if x < 0:\n        raise TypeError('negative')\n    return x ** 0.5", """
            import pytest
            from solution import root
            def test_raises():
                with pytest.raises(ValueError):
                    root(-1)
            def test_value():
                assert root(4) == 2
            """, "root", right=False),
        case("pytest_xfail_strict_passes", "def div(a, b):\n    return a / b if b else 0", """
            import pytest
            from solution import div
            @pytest.mark.xfail(strict=True)
            def test_by_zero():
                assert div(1, 0) == 0
            """, "div", right=False),
        case("pytest_fixture_wrong", "class Stack(list):\n    def push(self, x):\n        self.insert(0, x)", """
            import pytest
            from solution import Stack
            @pytest.fixture
            def full():
                s = Stack()
                s.push(1)
                s.push(2)
                return s
            def test_pop(full):
                assert full.pop() == 2
            """, "Stack", right=False),
    ]


def _unittest() -> list[Case]:
    return [
        case("unittest_main_trailer", "def square(x):\n    return x * x", """
            import unittest
            from solution import square
            class TestSquare(unittest.TestCase):
                def test_small(self):
                    self.assertEqual(square(3), 9)
                def test_zero(self):
                    self.assertEqual(square(0), 0)
            if __name__ == "__main__":
                unittest.main()
            """, "square"),
        case("unittest_module_and_class_fixtures", "LOG = []\ndef record(x):\n    LOG.append(x)\n    return len(LOG)", """
            import unittest
            from solution import record
            STATE = {}
            def setUpModule():
                STATE["module"] = record("module")
            def tearDownModule():
                STATE.clear()
            class TestFixtures(unittest.TestCase):
                @classmethod
                def setUpClass(cls):
                    cls.first = record("class")
                def setUp(self):
                    self.n = record("test")
                def test_order(self):
                    self.assertEqual(STATE["module"], 1)
                    self.assertEqual(self.first, 2)
                    self.assertGreaterEqual(self.n, 3)
            """, "record"),
        case("unittest_inherited_setup", "def double(x):\n    return 2 * x", """
            import unittest
            from solution import double
            class Base(unittest.TestCase):
                def setUp(self):
                    self.value = 21
            class TestDouble(Base):
                def test_it(self):
                    self.assertEqual(double(self.value), 42)
            """, "double"),
        case("unittest_subtest_skip_expected_failure", "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))", """
            import unittest
            from solution import is_prime
            class TestPrime(unittest.TestCase):
                def test_many(self):
                    for n, want in [(2, True), (4, False), (7, True), (9, False)]:
                        with self.subTest(n=n):
                            self.assertEqual(is_prime(n), want)
                @unittest.skip("slow")
                def test_large(self):
                    self.assertTrue(is_prime(2 ** 61 - 1))
                @unittest.skipIf(True, "never")
                def test_never(self):
                    self.fail()
                @unittest.expectedFailure
                def test_one_is_prime(self):
                    self.assertTrue(is_prime(1))
            """, "is_prime"),
        case("unittest_assert_raises_base_class", """
            class ParseError(ValueError):
                pass
            def parse(text):
                if not text.isdigit():
                    raise ParseError(text)
                return int(text)
            """, """
            import unittest
            from solution import parse, ParseError
            class TestParse(unittest.TestCase):
                def test_base(self):
                    with self.assertRaises(ValueError):
                        parse("x")
                def test_own(self):
                    self.assertRaises(ParseError, parse, "y")
                def test_ok(self):
                    self.assertEqual(parse("12"), 12)
            """, "parse"),
        case("unittest_rich_asserts", COUNTS, """
            import unittest
            from collections import Counter
            from solution import char_counts
            class TestCounts(unittest.TestCase):
                def test_equal(self):
                    self.assertEqual(char_counts("aab"), Counter({"a": 2, "b": 1}))
                def test_dict(self):
                    self.assertDictEqual(dict(char_counts("ab")), {"a": 1, "b": 1})
                def test_count_equal(self):
                    self.assertCountEqual(char_counts("abc").keys(), ["c", "b", "a"])
                def test_almost(self):
                    self.assertAlmostEqual(sum(char_counts("aaa").values()) / 7, 0.4285714, places=6)
            """, "char_counts"),
        case("unittest_mock_decorator", """
            def fetch(url):
                raise RuntimeError("no network in tests")
            def size(url):
                return len(fetch(url))
            """, """
            import unittest
            from unittest import mock
            from solution import size
            class TestSize(unittest.TestCase):
                @mock.patch("solution.fetch")
                def test_size(self, fetch):
                    fetch.return_value = "abcd"
                    self.assertEqual(size("http://x"), 4)
                    fetch.assert_called_once_with("http://x")
            """, "size"),
        case("unittest_assert_logs_and_types", """
            import logging
            from collections import Counter
            def tally(words):
                logging.getLogger("tally").warning("counting %d words", len(words))
                return Counter(words)
            def nothing():
                return None
            """, """
            import unittest
            from solution import tally, nothing
            class TestTally(unittest.TestCase):
                def test_logs(self):
                    with self.assertLogs("tally", level="WARNING") as logs:
                        tally(["a", "b"])
                    self.assertIn("counting 2 words", logs.output[0])
                def test_types(self):
                    self.assertIsInstance(tally(["a"]), dict)
                    self.assertIsNone(nothing())
            """, "tally"),
        case("unittest_expected_failure_inverted", "def is_prime(n):\n    return n >= 1", """
            import unittest
            from solution import is_prime
            class TestPrime(unittest.TestCase):
                def test_two(self):
                    self.assertTrue(is_prime(2))
                @unittest.expectedFailure
                def test_one_is_prime(self):
                    self.assertTrue(is_prime(1))
            """, "is_prime", right=False),
        case("unittest_subtest_wrong", "def is_prime(n):\n    return n % 2 == 1", """
            import unittest
            from solution import is_prime
            class TestPrime(unittest.TestCase):
                def test_many(self):
                    for n, want in [(3, True), (9, False)]:
                        with self.subTest(n=n):
                            self.assertEqual(is_prime(n), want)
                def test_two(self):
                    self.assertTrue(is_prime(2))
            """, "is_prime", right=False),
        case("unittest_setup_module_fails", "def record(x):\n    raise KeyError(x)", """
            import unittest
            from solution import record
            def setUpModule():
                record("module")
            class TestIt(unittest.TestCase):
                def test_a(self):
                    self.assertTrue(True)
            """, "record", right=False),
        case("unittest_assert_raises_wrong", "def parse(text):\n    return int(text)", """
            import unittest
            from solution import parse
            class TestParse(unittest.TestCase):
                def test_raises(self):
                    with self.assertRaises(TypeError):
                        parse("x")
            """, "parse", right=False),
    ]


def _environment() -> list[Case]:
    """What a Python user expects of the program's process: threads, asyncio, multiprocessing, numpy, stdout and
    stdin as the test sets them, mocks and monkeypatches that reach the program."""
    return [
        case("asyncio", """
            import asyncio
            async def one(x):
                await asyncio.sleep(0.01)
                return x * 2
            def run_all(xs):
                async def main():
                    return await asyncio.gather(*(one(x) for x in xs))
                return asyncio.run(main())
            """, "from solution import run_all\ndef test_gather():\n    assert run_all([1, 2, 3]) == [2, 4, 6]", "run_all"),
        case("multiprocessing_pool", """
            from multiprocessing import Pool
            def square(x):
                return x * x
            def squares(xs):
                with Pool() as pool:
                    return pool.map(square, xs)
            """, "from solution import squares\ndef test_pool():\n    assert squares(list(range(20))) == [x * x for x in range(20)]",
             "squares"),
        case("ten_threads", """
            import threading
            from concurrent.futures import ThreadPoolExecutor
            def tally(n):
                total, lock = [0], threading.Lock()
                def work(_):
                    for _ in range(500):
                        with lock:
                            total[0] += 1
                with ThreadPoolExecutor(max_workers=n) as pool:
                    list(pool.map(work, range(n)))
                return total[0], threading.active_count()
            """, "from solution import tally\ndef test_threads():\n    assert tally(10)[0] == 5000", "tally"),
        case("ten_live_threads", """
            import threading
            def together(n):
                barrier = threading.Barrier(n + 1)
                seen = []
                def wait():
                    barrier.wait()  # every thread alive at once
                    seen.append(1)
                threads = [threading.Thread(target=wait) for _ in range(n)]
                for t in threads:
                    t.start()
                alive = threading.active_count()
                barrier.wait()
                for t in threads:
                    t.join()
                return alive, len(seen)
            """, "assert together(10) == (11, 10)", "together"),
        case("numpy", "import numpy as np\ndef stats(xs):\n    a = np.array(xs, dtype=float)\n    return float(a.mean()), float(a.std())",
             "import math\nm, s = stats([1, 2, 3, 4])\nassert m == 2.5 and math.isclose(s, 1.118033988749895)", "stats",
             needs="numpy"),
        case("capsys", "def greet(name):\n    print(f'hello {name}')\n    print('done')", """
            from solution import greet
            def test_output(capsys):
                greet('bob')
                out, err = capsys.readouterr()
                assert out == 'hello bob\\ndone\\n' and err == ''
            """, "greet"),
        case("redirect_stdout", "def report(xs):\n    for x in xs:\n        print(x)", """
            import io, contextlib
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                report([1, 2])
            assert buffer.getvalue() == '1\\n2\\n'
            """, "report"),
        case("patched_input", "def ask():\n    a = int(input('a? '))\n    b = int(input())\n    return a + b", """
            import io
            from solution import ask
            def test_monkeypatched_input(monkeypatch):
                answers = iter(['3', '4'])
                monkeypatch.setattr('builtins.input', lambda *args: next(answers))
                assert ask() == 7
            def test_stdin(monkeypatch, capsys):
                monkeypatch.setattr('sys.stdin', io.StringIO('5\\n6\\n'))
                assert ask() == 11
                assert capsys.readouterr().out == 'a? '
            """, "ask"),
        case("mock_internals", "def fetch(x):\n    raise RuntimeError('network')\ndef total(xs):\n    return sum(fetch(x) for x in xs)", """
            from unittest import mock
            from solution import total
            def test_patched():
                with mock.patch('solution.fetch', return_value=3) as fake:
                    assert total([1, 2]) == 6
                assert fake.call_count == 2
                fake.assert_called_with(2)
            """, "total"),
        case("mock_standard_module", "import random\ndef roll():\n    return random.randint(1, 6) * 10", """
            from unittest import mock
            from solution import roll
            def test_mock():
                with mock.patch('random.randint', return_value=4):
                    assert roll() == 40
            def test_monkeypatch(monkeypatch):
                monkeypatch.setattr('random.randint', lambda a, b: 2)
                assert roll() == 20
            def test_real_again():
                assert roll() in (10, 20, 30, 40, 50, 60)
            """, "roll"),
        case("monkeypatch_env_and_cwd", "import os\ndef mode():\n    return os.environ.get('MODE', 'none')\n"
             "def here():\n    return os.path.basename(os.getcwd())", """
            from solution import mode, here
            def test_env(monkeypatch):
                monkeypatch.setenv('MODE', 'fast')
                assert mode() == 'fast'
            def test_restored():
                assert mode() == 'none'
            def test_cwd(monkeypatch, tmp_path):
                monkeypatch.chdir(tmp_path)
                assert here() == tmp_path.name
            """, "mode"),
        case("patched_sleep", "import time\ndef wait_then(x):\n    time.sleep(100)\n    return x", """
            from solution import wait_then
            def test_no_wait(monkeypatch):
                slept = []
                monkeypatch.setattr('time.sleep', slept.append)
                assert wait_then(4) == 4 and slept == [100]
            """, "wait_then"),
        case("asyncio_wrong", """
            import asyncio
            async def one(x):
                return x
            def run_all(xs):
                return asyncio.run(asyncio.gather(*(one(x) for x in xs))) if False else list(xs)
            """, "from solution import run_all\ndef test_gather():\n    assert run_all([1, 2]) == [2, 4]", "run_all",
             right=False),
        case("multiprocessing_wrong", """
            from multiprocessing import Pool
            def square(x):
                return x + x
            def squares(xs):
                with Pool(2) as pool:
                    return pool.map(square, xs)
            """, "from solution import squares\ndef test_pool():\n    assert squares([1, 3]) == [1, 9]", "squares", right=False),
        case("capsys_wrong", "def greet(name):\n    return f'hello {name}'", """
            from solution import greet
            def test_output(capsys):
                greet('bob')
                assert capsys.readouterr().out == 'hello bob\\n'
            """, "greet", right=False),
        case("patched_input_ignored", "def ask():\n    return 7", """
            from solution import ask
            def test_input(monkeypatch):
                monkeypatch.setattr('builtins.input', lambda *a: '5')
                assert ask() == 5
            """, "ask", right=False),
        case("mock_wrong", "def fetch(x):\n    return 1\ndef total(xs):\n    return len(xs)", """
            from unittest import mock
            from solution import total
            def test_patched():
                with mock.patch('solution.fetch', return_value=3):
                    assert total([1, 2]) == 6
            """, "total", right=False),
        case("numpy_wrong", "import numpy as np\ndef stats(xs):\n    return float(np.median(xs)), 0.0",
             "m, s = stats([1, 2, 3, 10])\nassert m == 4.0", "stats", right=False, needs="numpy"),
    ]


def _stdio() -> list[Case]:
    return [
        stdio("stdio_sum", "a, b = map(int, input().split())\nprint(a + b)", [("1 2\n", "3\n"), ("-5 5\n", "0\n")]),
        stdio("stdio_lines_exact", "n = int(input())\nfor i in range(1, n + 1):\n    print('*' * i)",
              [("3\n", "*\n**\n***\n"), ("1\n", "*\n")], compare="exact"),
        stdio("stdio_float", "import sys\nx = float(sys.stdin.read())\nprint(x / 3)", [("1\n", "0.333333333\n"), ("3\n", "1\n")],
              compare="float"),
        stdio("stdio_read_all", "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(max(nums), min(nums))",
              [("3 9 1\n4\n", "9 1\n")]),
        stdio("stdio_until_eof", """
            total = 0
            while True:
                try:
                    line = input()
                except EOFError:
                    break
                total += int(line)
            print(total)
            """, [("1\n2\n3\n", "6\n"), ("", "0\n")]),
        stdio("stdio_buffer", "import sys\ndata = sys.stdin.buffer.read().split()\nsys.stdout.write(str(sum(map(int, data))) + '\\n')",
              [("1 2 3\n", "6\n")]),
        stdio("stdio_whitespace", "print(' '.join(input().split()[::-1]))", [("a  b c\n", "c b a")]),
        stdio("stdio_wrong", "a, b = map(int, input().split())\nprint(a - b)", [("1 2\n", "3\n"), ("0 0\n", "0\n")], right=False),
        stdio("stdio_float_wrong", "x = float(input())\nprint(round(x / 3, 2))", [("1\n", "0.333333333\n")], compare="float",
              right=False),
        stdio("stdio_exact_wrong", "n = int(input())\nprint(' '.join('*' * i for i in range(1, n + 1)))",
              [("2\n", "*\n**\n")], compare="exact", right=False),
        stdio("stdio_crash", "print(1 / int(input()))", [("0\n", "0\n")], right=False),
    ]


# ----------------------------------------------------------------------------------------------------
# rlvr's verdicts and the real runners'.


def ground_truth(c: Case) -> str:
    from rlvr.tasks.code import code_answer, stdio_answer

    return stdio_answer(list(c.stdio), c.compare) if c.stdio else code_answer(list(c.tests), c.entry)


def rlvr_verdicts(chosen: list[Case]) -> dict:
    """name -> [passed, total, reason], every case graded by rlvr in one batch (the sandbox's defaults)."""
    from rlvr.grading.code import grade_programs
    from rlvr.sandbox import configure
    from rlvr.sandbox.launch import packages

    configure("bwrap")
    out = grade_programs([c.program for c in chosen], [ground_truth(c) for c in chosen])
    return {"verdicts": {c.name: [v[0], v[1], v.reason] for c, v in zip(chosen, out)},
            "packages": sorted(name for name, _ in packages())}


def _module_text(text: str, i: int) -> str:
    return re.sub(r"\bsolution\b", f"solution_{i}", text)


def real_verdicts(chosen: list[Case], python: str = sys.executable) -> dict:
    """name -> (passed, total) as the real runner gives them: pytest (one run for every pytest file), unittest (one
    process loading each module, and `python file.py` for a file with the `unittest.main()` trailer), the script
    itself, the program on each input."""
    from rlvr.grading.code_tests import parse_tests

    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="rlvr-battery-") as where:
        root = Path(where)
        runners = {c.name: parse_tests(ground_truth(c)).runner for c in chosen}
        for i, c in enumerate(chosen):
            (root / f"solution_{i}.py").write_text(c.program)
            if not c.stdio:
                text = f"from solution_{i} import *\n" + _module_text("\n".join(c.tests), i)
                (root / f"test_case_{i}.py").write_text(text)
        pytest_files = [f"test_case_{i}.py" for i, c in enumerate(chosen) if runners[c.name] == "pytest"]
        if pytest_files:
            subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                            "--junitxml=report.xml", *pytest_files], cwd=root, capture_output=True, timeout=600)
            per_file: dict = {}
            for test in ET.parse(root / "report.xml").iter("testcase"):
                stem = test.get("classname", "").split(".")[0]
                failed = test.find("failure") is not None or test.find("error") is not None
                passed, total = per_file.get(stem, (0, 0))
                per_file[stem] = (passed + (not failed), total + 1)
            for i, c in enumerate(chosen):
                if runners[c.name] == "pytest":
                    out[c.name] = per_file.get(f"test_case_{i}", (0, 1))
        cases = [(i, c) for i, c in enumerate(chosen) if runners[c.name] == "unittest"]
        if cases:
            done = subprocess.run([python, "-c", _UNITTEST, *[str(i) for i, _ in cases]], cwd=root, capture_output=True,
                                  text=True, timeout=600)
            counts = json.loads(done.stdout.strip().splitlines()[-1])
            for i, c in cases:
                out[c.name] = tuple(counts[str(i)])
                if "unittest.main()" in "".join(c.tests):  # the script as its trailer runs it: the same verdict
                    whole = subprocess.run([python, f"test_case_{i}.py"], cwd=root, capture_output=True, timeout=120)
                    if (whole.returncode == 0) != (out[c.name][0] == out[c.name][1]):
                        out[c.name] = ("disagree", whole.returncode)
        for i, c in enumerate(chosen):
            if runners[c.name] == "script":  # the file after the program, `solution` importable as the program
                source = (f"import sys, solution_{i}\nsys.modules['solution'] = solution_{i}\n" + c.program + "\n"
                          + "\n".join(c.tests) + (f"\ncheck({c.entry})\n" if "def check(" in "".join(c.tests) and c.entry
                                                  else ""))
                done = subprocess.run([python, "-c", source], cwd=root, capture_output=True, timeout=120)
                out[c.name] = ("all", done.returncode == 0)
            elif runners[c.name] == "stdio":
                from rlvr.sandbox.inside.runners import same_output

                passed = 0
                for stdin, want in c.stdio:
                    done = subprocess.run([python, f"solution_{i}.py"], cwd=root, input=stdin, capture_output=True,
                                          text=True, timeout=120)
                    passed += done.returncode == 0 and same_output(done.stdout, want, c.compare)
                out[c.name] = (passed, len(c.stdio))
    return out


_UNITTEST = """
import importlib.util, json, sys, unittest
counts = {}
for i in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location(f"test_case_{i}", f"test_case_{i}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    def flat(s):
        return [c for t in s for c in (flat(t) if isinstance(t, unittest.TestSuite) else [t])]
    tests = flat(suite)  # before the run, which lets go of them
    result = unittest.TestResult()
    suite.run(result)
    # a failed subTest is reported as its _SubTest: its test fails
    bad = {id(getattr(t, "test_case", t)) for t, _ in result.failures + result.errors}
    bad |= {id(t) for t in result.unexpectedSuccesses}
    failed = sum(1 for case in tests if id(case) in bad)
    passed = result.testsRun - failed
    if not result.wasSuccessful() and passed == result.testsRun:  # a module fixture's error alone
        counts[i] = [passed, result.testsRun + 1]
    else:
        counts[i] = [passed, result.testsRun]
print(json.dumps(counts))
"""


def agree(case_: Case, rlvr: list, real) -> bool:
    """Whether rlvr's verdict is the real runner's: the same counts where the runner counts tests, the same
    verdict (all passed or not) where it runs the file as a script."""
    passed, total = rlvr[0], rlvr[1]
    if isinstance(real, tuple) and real and real[0] == "all":
        return (passed == total) == real[1]
    return tuple(real) == (passed, total)


if __name__ == "__main__":  # as another user: python3 code_battery.py grade OUT.json
    chosen = cases()
    Path(sys.argv[2]).write_text(json.dumps(rlvr_verdicts(chosen)))
    os._exit(0)
