"""The guarded reads found in guard code: the same as one regex alternation of every
guarded expression (the longest at each place, never inside a longer name or after a dot)."""

import random
import re

from kiln_capture.dispatch import _ChunkTree

SOURCES = [
    "x",
    "x_1",
    "self",
    "self._modules['a']",
    "self._modules['a']._parameters['weight']",
    "self._modules['a'].training",
    "self._modules['ab']",
    "self.__dict__['k']",
    "___closure[0].cell_contents",
    "___object_getattribute(self, 'w')",
    "___object_getattribute(self, 'w').v",
    "kwargs['scale']",
    "G['torch'].float32",
]

CODES = [
    "type(x) is ___T0 and x_1 == 3 and a.x is None and xx is x",
    "self._modules['a']._parameters['weight'] is not None and self._modules['a'].training",
    "self._modules['abc'] is self._modules['ab'] and self._modules['a'].trainingx",
    "___closure[0].cell_contents is ___id1 and ___closure[0].cell_contents.y",
    "___object_getattribute(self, 'w').v == 1 and ___object_getattribute(self, 'w')",
    "len(kwargs['scale']) == 2 and kwargs['scale2'] and G['torch'].float32 is ___d",
    "f(self)(self._modules['a'])[self.__dict__['k']]",
    "",
]


def reference(sources, code):
    alternatives = "|".join(map(re.escape, sorted(sources, key=len, reverse=True)))
    pattern = re.compile(rf"(?<![\w.])(?:{alternatives})(?!\w)")
    return [(m.start(), m.end(), m.group(0)) for m in pattern.finditer(code)]


def test_reads_are_found_as_the_alternation_finds_them():
    tree = _ChunkTree(SOURCES)
    for code in CODES:
        assert list(tree.occurrences(code)) == reference(SOURCES, code), code


def test_random_subsets_and_joins_agree_with_the_alternation():
    rng = random.Random(0)
    glue = [" and ", ".", "(", ")", "[", "]", "_", "a", ", ", " is ", "'"]
    for _ in range(300):
        sources = rng.sample(SOURCES, rng.randint(1, len(SOURCES)))
        code = "".join(rng.choice(SOURCES + glue) for _ in range(rng.randint(1, 12)))
        assert list(_ChunkTree(sources).occurrences(code)) == reference(sources, code), (
            sources,
            code,
        )


def test_an_expression_that_does_not_start_with_a_name_uses_the_alternation():
    sources = ["(a)", "(a).b", "a"]
    code = "(a).b is (a) and a"
    tree = _ChunkTree(sources)
    assert tree.fallback is not None
    assert list(tree.occurrences(code)) == reference(sources, code)
