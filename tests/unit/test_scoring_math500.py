"""MATH-500 answer checking, table-driven: gold = the dataset's LaTeX `answer` field."""

import pytest

from bwprune.benchmarks.math500 import MATH500

BENCH = MATH500("math500", None, "{question}")
MATRIX = r"\begin{pmatrix} -1/3 \\ 2/3 \end{pmatrix}"

CASES = [
    # completion, gold (as in the data file), expected correct (None = unscorable)
    (r"\boxed{\dfrac{14}{3}}", r"\frac{14}{3}", True),
    (r"\boxed{\frac{4}{3}}", r"\frac43", True),  # \frac43 shorthand in the gold
    (r"\boxed{\frac12}", r"\frac{1}{2}", True),  # ... and in the prediction
    (r"\boxed{0.5}", r"\frac{1}{2}", True),
    (r"\boxed{\frac{9}{5}}", r"1\frac{4}{5}", True),  # a mixed number
    (r"\boxed{90}", r"90^\circ", True),  # degrees
    (r"\boxed{90^{\circ}}", r"90^\circ", True),
    (r"\boxed{5.4}", r"5.4 \text{ cents}", True),  # units in the gold
    (r"\boxed{864}", r"864 \mbox{ inches}^2", True),
    (r"\boxed{32,348}", r"\$32,\!348", True),  # dollars and thousands separators
    (r"\boxed{11,111,111,100}", r"11,\! 111,\! 111,\! 100", True),
    (r"\boxed{50\%}", r"\frac{1}{2}", False),  # 50 is not 1/2: a percentage is its number
    (r"\boxed{(2, \infty)}", r"(2,\infty)", True),  # intervals
    (r"\boxed{[2, \infty)}", r"(2,\infty)", False),  # ... whose ends differ
    (r"\boxed{(0,9)\cup(9,36)}", r"(0,9) \cup (9,36)", True),
    (r"\boxed{\left(3, \frac{\pi}{2}\right)}", r"\left( 3, \frac{\pi}{2} \right)", True),
    (r"\boxed{(\frac{\pi}{2}, 3)}", r"\left( 3, \frac{\pi}{2} \right)", False),  # ordered tuple
    (r"\boxed{1+\sqrt{19}, 1-\sqrt{19}}", r"1 \pm \sqrt{19}", True),
    (r"\boxed{5}", "x=5", True),  # an equation gold, the value predicted
    (r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", True),  # a word answer
    (r"\boxed{(C)}", r"\text{(C)}", True),  # a letter in parentheses
    (r"\boxed{c}", r"\text{(C)}", True),  # lower-case letter
    (r"\boxed{(D)}", r"\text{(C)}", False),
    (rf"\boxed{{{MATRIX}}}", MATRIX, True),
    (r"First \boxed{3}, then \boxed{\frac{14}{3}}", r"\frac{14}{3}", True),  # the last box counts
    (r"\boxed{\frac{14}{3}} or maybe \boxed{3}", r"\frac{14}{3}", False),
    ("So the answer is $\\frac{1}{2}$.", r"\frac{1}{2}", True),  # no box: the last expression
    (r"<think>\boxed{2}</think> Hence \boxed{\frac{14}{3}}", r"\frac{14}{3}", True),
    (r"<think>Perhaps \boxed{\frac{14}{3}} but", r"\frac{14}{3}", None),  # unfinished think
    ("I cannot solve this.", r"\frac{14}{3}", None),  # nothing to extract
    # Thin spaces and braced commas as thousands separators: math-verify read 10\,080
    # as a product. Golds as in the data file.
    (r"\boxed{10\,080}", r"10,\!080", True),
    (r"\boxed{10{,}080}", r"10,\!080", True),
    (r"\boxed{10\!080}", r"10,\!080", True),
    (r"\boxed{\$32\,348}", r"\$32,\!348", True),
    (r"\boxed{11\,111\,111\,100}", r"11,\! 111,\! 111,\! 100", True),
    (r"\boxed{10\,081}", r"10,\!080", False),
    # \degree and the degree sign mean ^\circ.
    (r"\boxed{90\degree}", r"90^\circ", True),
    (r"\boxed{90°}", r"90^\circ", True),
    (r"\boxed{45\degree}", r"90^\circ", False),
    # A choice boxed with its label text, against a letter gold.
    (r"\boxed{\text{(C) } 4}", r"\text{(C)}", True),
    (r"\boxed{\textbf{(C)} \frac{1}{2}}", r"\text{(C)}", True),
    (r"\boxed{(C)\ y = 2x}", r"\text{(C)}", True),
    (r"\boxed{\text{(B) } 4}", r"\text{(C)}", False),
    (
        r"<think>(B)? no, C.</think>The answer is $\boxed{\text{(C) } \sqrt{2}}$.",
        r"\text{(C)}",
        True,
    ),
    (r"\boxed{52_{8}}", "52_8", True),  # subscripts with and without braces
]


@pytest.mark.parametrize(("completion", "gold", "expected"), CASES)
def test_math500_scoring(completion, gold, expected):
    assert BENCH.score(completion, gold, "stop").correct is expected
