"""The statements of a kernel body (``kiln_cpp.statements``): what each defines, reads and
renders, and the passes that decide on those fields (loops fused, spills dropped, index
checks moved into lanes) without reading C++ text."""

import torch

from kiln_cpp import CppCodegen
from kiln_cpp.handler import CppOpsHandler
from kiln_cpp.loops import merge_independent_loops
from kiln_cpp.statements import (
    Accumulation,
    CheckIndex,
    Declare,
    Define,
    Element,
    Expr,
    PointArray,
    PointWrite,
    ReductionLoop,
    Store,
    Update,
    mark,
    names,
    per_point,
    point_read,
)
from kiln_cpp.vectorize import flag_lanes
from kiln_loopir.testing import compile_fn


def _expr(text: str, *values: str) -> Expr:
    for v in values:
        text = text.replace("{" + v + "}", mark(v))
    return Expr.of(text)


def test_an_expression_keeps_its_names_apart_from_its_text():
    e = _expr("({tmp1} + kiln::exp({tmp12}))", "tmp1", "tmp12")
    assert e.reads == ("tmp1", "tmp12")
    assert str(e) == "(tmp1 + kiln::exp(tmp12))"
    # renaming touches names only, never text that happens to spell one
    renamed = _expr("tmp1_spill[{tmp1}]", "tmp1").renamed({"tmp1": "tmp7"})
    assert str(renamed) == "tmp1_spill[tmp7]"
    assert renamed.reads == ("tmp7",)
    assert point_read("tmp3_spill", "r0") == Expr.of(f"{mark('tmp3_spill')}[r0]")


def test_each_statement_defines_reads_and_renders_one_line():
    define = Define("tmp4", "float", _expr("({tmp2} * {tmp3})", "tmp2", "tmp3"))
    store = Store(_expr("buf0[{tmp5}]", "tmp5"), _expr("static_cast<float>({tmp4})", "tmp4"))
    check = CheckIndex(_expr("!{tmp6}", "tmp6"))
    declare = Declare("acc7", "double", "0")
    welford = Declare("acc8", "kiln::Welford<float>")
    twin = Declare("acc9", "kiln::Welford<float>", twin="acc8")
    update = Update("acc7", _expr("{acc7} += {tmp4};", "acc7", "tmp4"))
    array = PointArray("tmp4", "spill", "float", "8192")
    write = PointWrite("tmp4", "spill", "r0", "tmp4")
    table = [
        (define, {"tmp4"}, ("tmp2", "tmp3"), "const float tmp4 = (tmp2 * tmp3);"),
        (store, set(), ("tmp5", "tmp4"), "buf0[tmp5] = static_cast<float>(tmp4);"),
        (check, set(), ("tmp6",),
         "if (!tmp6) __atomic_store_n(&kiln_oob, 1, __ATOMIC_RELAXED);"),
        (declare, {"acc7"}, (), "double acc7 = 0;"),
        (welford, {"acc8"}, (), "kiln::Welford<float> acc8;"),
        (twin, {"acc9"}, ("acc8",), "kiln::Welford<float>& acc9 = acc8;"),
        (update, set(), ("acc7", "tmp4"), "acc7 += tmp4;"),
        (array, {"tmp4_spill"}, (), "std::vector<float> tmp4_spill(8192);"),
        (write, set(), ("tmp4",), "tmp4_spill[r0] = tmp4;"),
    ]  # fmt: skip
    for statement, defines, reads, line in table:
        assert set(statement.defines) == defines, statement
        assert statement.reads == reads, statement
        assert statement.render() == line
    assert per_point(array) and per_point(write) and not per_point(define)
    read_back = Define("tmp9", "float", point_read("tmp4_spill", "r0"),
                       Element("tmp4_spill", "r0", "tmp4"))  # fmt: skip
    assert per_point(read_back) and names(read_back) == {"tmp9", "tmp4_spill"}


def test_index_checks_in_lanes_become_ors_into_the_loops_flag():
    check = CheckIndex(_expr("!{tmp1}", "tmp1"))
    define = Define("tmp2", "int64_t", _expr("({tmp1} ? {tmp0} : 0)", "tmp1", "tmp0"))
    flagged = flag_lanes([check, define], "kiln_oob3")
    assert flagged[1] is define
    assert flagged[0].render() == "kiln_oob3 |= (!tmp1);"
    assert flag_lanes(flagged, "kiln_oob") == flagged  # flagged once


def _load(value: str, element: str) -> Define:
    return Define(value, "float", Expr((element,)))


def _sum_loop(id_: int, body: list, value: str, acc: str) -> ReductionLoop:
    """A loop running ``body`` and summing ``value`` into ``acc``."""
    update = Update(acc, _expr(f"{{{acc}}} += {{{value}}};", acc, value))
    loop = ReductionLoop(id_, [Declare(acc, "float", "0")], [*body, update], True)
    loop.reductions.append(Accumulation("sum", acc, value, torch.float32, [update]))
    return loop


def test_independent_loops_fuse_and_reuse_what_the_first_computes():
    first = _sum_loop(1, [_load("tmp0", "x[r0]")], "tmp0", "acc1")
    mean = Define("tmp2", "float", _expr("({acc1} / 64)", "acc1"))
    square = Define("tmp5", "float", _expr("({tmp3} * {tmp3})", "tmp3"))
    # the same load as the first loop's: tmp3 is tmp0
    second = _sum_loop(2, [_load("tmp3", "x[r0]"), square], "tmp5", "acc4")
    merged, after = merge_independent_loops([first, mean, second])
    assert after is mean  # the statement between moves after the fused loop
    assert [s.render() for s in merged.prologue] == ["float acc1 = 0;", "float acc4 = 0;"]
    assert [s.render() for s in merged.body] == [
        "const float tmp0 = x[r0];",
        "acc1 += tmp0;",
        "const float tmp5 = (tmp0 * tmp0);",
        "acc4 += tmp5;",
    ]
    assert [a.acc for a in merged.reductions] == ["acc1", "acc4"]


def test_a_loop_that_reads_the_first_ones_result_is_not_fused():
    first = _sum_loop(1, [_load("tmp0", "x[r0]")], "tmp0", "acc1")
    mean = Define("tmp2", "float", _expr("({acc1} / 64)", "acc1"))
    centred = Define("tmp5", "float", _expr("({tmp3} - {tmp2})", "tmp3", "tmp2"))
    second = _sum_loop(2, [_load("tmp3", "x[r0]"), centred], "tmp5", "acc4")
    assert merge_independent_loops([first, mean, second]) == [first, mean, second]


def test_a_welford_of_the_same_value_becomes_a_reference_and_its_spill_goes():
    def welford(id_, value, acc):
        define = Define(value, "float", Expr(("x[r0]",)))
        update = Update(acc, _expr(f"{{{acc}}}.update({{{value}}});", acc, value))
        loop = ReductionLoop(id_, [Declare(acc, "kiln::Welford<float>")], [define, update])
        loop.closed = True
        loop.reductions.append(Accumulation("welford.mean", acc, value, torch.float32, [update]))
        return loop

    first, second = welford(1, "tmp0", "acc1"), welford(2, "tmp2", "acc3")
    # the first spills its value for the second, which reads it back at the same point
    first.prologue.append(PointArray("tmp0", "spill", "float", "8192"))
    first.body.append(PointWrite("tmp0", "spill", "r0", "tmp0"))
    read = Define("tmp4", "float", point_read("tmp0_spill", "r0"),
                  Element("tmp0_spill", "r0", "tmp0"))  # fmt: skip
    second.body.insert(1, read)
    second.body.append(Store(Expr(("out[r0]",)), _expr("{tmp4}", "tmp4")))
    (merged,) = merge_independent_loops([first, second])
    assert Declare("acc3", "kiln::Welford<float>", twin="acc1") in merged.prologue
    assert not any(isinstance(s, PointArray | PointWrite) for s in merged.prologue + merged.body)
    assert [s.render() for s in merged.body] == [
        "const float tmp0 = x[r0];",
        "acc1.update(tmp0);",
        "out[r0] = tmp0;",
    ]


class _Kernels(CppCodegen):
    """Keeps the kernels it renders."""

    def __init__(self) -> None:
        super().__init__()
        self.rendered = []

    def render(self, kernel):
        self.rendered.append(kernel)
        return super().render(kernel)


def test_the_handler_names_what_each_statement_reads():
    codegen = _Kernels()
    weight, ids = torch.randn(50, 8), torch.randint(0, 50, (6,))
    compile_fn(lambda w, i: torch.nn.functional.embedding(i, w) * 2, [weight, ids],
               codegen=codegen)  # fmt: skip
    (kernel,) = codegen.rendered
    handler = CppOpsHandler(kernel)
    kernel.body(handler)
    defined = {s.name: s for s in handler.items if isinstance(s, Define)}
    (check,) = [s for s in handler.items if isinstance(s, CheckIndex)]
    (ok,) = check.reads
    assert defined[ok].ctype == "bool"
    # the row read goes through the checked index: its load reads the index's value
    row = next(s for s in defined.values() if s.element and s.reads)
    (index,) = row.reads
    assert ok in defined[index].reads
    (store,) = [s for s in handler.items if isinstance(s, Store)]
    assert set(store.reads) <= set(defined)
