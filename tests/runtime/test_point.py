"""runtime.point: the one shape and point type, and the one set of bounds every reader checks."""

from __future__ import annotations

import pytest

from a2a_tune.tuner.runtime.point import (
    MAX_EP_SIZE,
    MAX_EXPERTS,
    MAX_HIDDEN,
    MAX_TOKENS_PER_RANK,
    MAX_TOPK,
    POINT_FIELDS,
    SHAPE_FIELDS,
    Point,
    PointError,
    Shape,
    check_count,
    check_tokens,
)

DSV3 = Shape(8, 7168, 8, 256, "bf16", "uniform")


def test_one_field_order_for_shape_and_point():
    assert SHAPE_FIELDS == ("ep_size", "hidden", "topk", "num_experts", "dtype", "routing")
    assert POINT_FIELDS == SHAPE_FIELDS + ("tokens_per_rank",)
    p = DSV3.at(128)
    assert isinstance(p, Point) and p == (8, 7168, 8, 256, "bf16", "uniform", 128)
    assert p.shape == DSV3 and type(p.shape) is Shape
    assert p._asdict() == {**DSV3._asdict(), "tokens_per_rank": 128}
    # equal and hashing equal to the plain tuples they replace
    assert {DSV3: 1}[(8, 7168, 8, 256, "bf16", "uniform")] == 1


def test_describe_names_every_field_in_one_line():
    assert DSV3.describe() == "ep_size=8 hidden=7168 topk=8 num_experts=256 dtype=bf16 routing=uniform"


@pytest.mark.parametrize("tokens", [1, 4096, MAX_TOKENS_PER_RANK])
def test_token_counts_inside_the_bound_pass(tokens):
    assert check_tokens(tokens) == tokens


@pytest.mark.parametrize(
    "value, message",
    [
        (0, f"tokens per rank must be in 1..{MAX_TOKENS_PER_RANK}, got 0"),
        (-3, f"tokens per rank must be in 1..{MAX_TOKENS_PER_RANK}, got -3"),
        (
            MAX_TOKENS_PER_RANK + 1,
            f"tokens per rank must be in 1..{MAX_TOKENS_PER_RANK}, got {MAX_TOKENS_PER_RANK + 1}",
        ),
        (True, "tokens per rank must be a whole number, got True"),
        (8.0, "tokens per rank must be a whole number, got 8.0"),
        ("8", "tokens per rank must be a whole number, got '8'"),
    ],
)
def test_token_counts_outside_the_bound_are_one_line(value, message):
    with pytest.raises(PointError) as info:
        check_tokens(value)
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)  # callers that catch ValueError keep working


def test_a_huge_value_is_cut_in_the_message():
    with pytest.raises(PointError) as info:
        check_count(10**400, "hidden", MAX_HIDDEN)
    assert len(str(info.value)) < 100 and str(info.value).endswith("…")


@pytest.mark.parametrize(
    "shape, problem",
    [
        (DSV3._replace(ep_size=0), "ep_size must be in 1..1024, got 0"),
        (DSV3._replace(ep_size=MAX_EP_SIZE + 1), f"ep_size must be in 1..{MAX_EP_SIZE}, got {MAX_EP_SIZE + 1}"),
        (DSV3._replace(hidden=10**9), f"hidden must be in 1..{MAX_HIDDEN}, got 1000000000"),
        (DSV3._replace(topk=MAX_TOPK + 1), f"topk must be in 1..{MAX_TOPK}, got {MAX_TOPK + 1}"),
        (DSV3._replace(num_experts=10**9), f"num_experts must be in 1..{MAX_EXPERTS}, got 1000000000"),
        (DSV3._replace(topk=9, num_experts=8), "topk 9 is more than the 8 experts"),
        (DSV3._replace(dtype=""), "dtype must be a non-empty name, got ''"),
        (DSV3._replace(routing=None), "routing must be a non-empty name, got None"),
    ],
)
def test_impossible_shapes_say_why_in_one_line(shape, problem):
    assert shape.problem() == problem
    assert shape.problem(measuring=True) == problem
    with pytest.raises(PointError, match="^" + problem.replace("(", r"\(").replace(")", r"\)") + "$"):
        shape.checked()


def test_uneven_experts_are_a_shape_engines_run_but_not_one_we_measure():
    uneven = DSV3._replace(ep_size=3)  # TensorRT-LLM runs it (ALLGATHER, NVLINK_ONE_SIDED)
    assert uneven.problem() is None and uneven.checked() is uneven
    assert uneven.problem(measuring=True) == "256 experts do not divide over 3 ranks"
    local = Shape(2, 64, 4, 4, "bf16", "local")  # 2 experts per rank, 4 per token, all local: impossible
    assert local.problem() is None
    assert local.problem(measuring=True) == "'local' routing needs topk 4 <= the 2 experts of one rank"
    assert DSV3.problem(measuring=True) is None


def test_a_point_checks_its_shape_then_its_token_count():
    assert DSV3.at(64).checked() == DSV3.at(64)
    with pytest.raises(PointError, match="topk 9 is more than the 8 experts"):
        Point(2, 64, 9, 8, "bf16", "uniform", 0).checked()
    with pytest.raises(PointError, match=f"tokens per rank must be in 1..{MAX_TOKENS_PER_RANK}, got 0"):
        DSV3.at(0).checked()
    with pytest.raises(PointError, match="do not divide"):
        DSV3._replace(ep_size=3).at(8).checked(measuring=True)
