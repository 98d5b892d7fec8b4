"""The waiting line kept in order (``core.line.Line``) gives the answers of sorting the
whole line and walking it (``line_order``, ``place``) after any joins, leaves, new
standings, groups waited for and clocks moving on or set back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyterhub_gpu.core.fairshare import Waiter, line_order, place
from jupyterhub_gpu.core.line import Line

MAX_WAIT = 600.0
#: each group's chain: itself and its parents (``Policy.charged_groups``)
CHAINS = {
    "nlp": ("nlp", "research"),
    "cv": ("cv", "research"),
    "research": ("research",),
    "lab": ("lab",),
}
KEYS = [f"ns/s{i}" for i in range(6)]
standings = st.tuples(*[st.sampled_from([0.0, 0.5, 2.0])] * 3)

operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("join"),
            st.sampled_from(KEYS),
            st.sampled_from(sorted(CHAINS)),
            st.sampled_from([0.0, -100.0, -599.0, -600.0, -601.0, -2000.0]),  # arrived
            st.integers(0, 4),  # seq: ties happen
            standings,
        ),
        st.tuples(st.just("leave"), st.sampled_from(KEYS)),
        st.tuples(st.just("block"), st.sampled_from(KEYS), st.sampled_from([None, *CHAINS])),
        st.tuples(st.just("restand"), st.sampled_from(KEYS), standings),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 1.0, 300.0, 600.0, -30.0])),
    ),
    max_size=40,
)


def check(line: Line, model: dict[str, Waiter], now: float, max_wait: float | None) -> None:
    """The line's order and every waiter's place are the straightforward ones."""
    expected = line_order(model.values(), now, max_wait)
    assert line.ordered(now) == expected
    for w in model.values():
        assert line.place(w, now) == place(w, expected)
    assert len(line) == len(model)


@pytest.mark.parametrize("max_wait", [MAX_WAIT, None])
@settings(max_examples=400, deadline=None)
@given(operations)
def test_the_kept_line_is_the_sorted_line_whatever_happens(max_wait, ops):
    now = 1_800_000_000.0
    line = Line(max_wait)
    model: dict[str, Waiter] = {}  # what the hub kept before: a dict in joining order
    for op in ops:
        kind, *args = op
        if kind == "join":
            key, group, arrived, seq, standing = args
            w = Waiter(key, "u", group, CHAINS[group], now + arrived, seq)
            w.standing, w.standing_at = standing, now
            model[key] = w
            line.join(w, now)
        elif kind == "leave":
            w = model.pop(args[0], None)
            if w is not None:
                line.leave(w)
        elif args[0] in model:
            w = model[args[0]]
            if kind == "block":
                line.block(w, args[1])
                assert w.blocked_on == args[1]
            else:
                line.restand(w, args[1], now)
                assert (w.standing, w.standing_at) == (args[1], now)
        elif kind == "tick":
            now += args[0]
        check(line, model, now, max_wait)


def test_a_waiter_that_left_leaves_the_one_that_replaced_it():
    line = Line(MAX_WAIT)
    first = Waiter("ns/a", "ann", "lab", ("lab",), 0.0, 0)
    again = Waiter("ns/a", "ann", "lab", ("lab",), 1.0, 1)
    line.join(first, 1.0)
    line.join(again, 1.0)
    other = Waiter("ns/b", "bob", "lab", ("lab",), 0.5, 2)
    line.join(other, 1.0)
    line.block(other, "lab")
    line.block(first, "lab")  # the first is not filed: nothing else moves
    line.restand(first, (1.0,), 1.0)
    # not in the line, the first is behind everyone (as a walk of the line finds it)
    assert line.place(first, 2.0) == place(first, line.ordered(2.0))
    assert line.place(first, 2.0).ahead == (other,)
    line.leave(first)  # the first spawn's wait ends after the second began
    assert line.ordered(2.0) == [again, other]
    assert line.place(again, 2.0).ahead == ()
