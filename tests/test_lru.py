"""`dspk.caches.LRU`, the bounded mapping of the caches that keep their recent entries: its
rules one by one, then any sequence of operations against a reference model (a list in
recency order, evicted from the front), the bounds in entries, in bytes and both."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspk.caches import LRU

MISSING = object()


def test_the_examples():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(LRU, "LRU", globs={}):
        runner.run(test)
    assert runner.failures == 0 and runner.tries > 0


def test_get_uses_an_entry_and_peek_does_not():
    lru = LRU(max_entries=2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.peek("a") == 1 and list(lru) == ["a", "b"]
    assert lru.get("a") == 1 and list(lru) == ["b", "a"]
    assert lru.get("z", "none") == "none" and lru.peek("z", 0) == 0
    lru.put("c", 3)
    assert list(lru.items()) == [("a", 1), ("c", 3)]


def test_put_of_a_held_key_moves_it_unless_not_touched():
    lru = LRU(max_entries=3)
    for k in "abc":
        lru.put(k, k)
    lru.put("a", "A")
    assert list(lru.items()) == [("b", "b"), ("c", "c"), ("a", "A")]
    lru.put("b", "B", touch=False)                 # replaced where it stands
    assert list(lru.items()) == [("b", "B"), ("c", "c"), ("a", "A")]
    lru.put("d", "d", touch=False)                 # a new key is the most recent all the same
    assert list(lru) == ["c", "a", "d"]


def test_move_to_end_pop_and_clear():
    lru = LRU(max_entries=3, max_bytes=100, nbytes=len)
    lru.put("a", "xx")
    lru.put("b", "yyy")
    lru.move_to_end("a")
    assert list(lru) == ["b", "a"]
    with pytest.raises(KeyError):
        lru.move_to_end("z")
    assert lru.pop("b") == "yyy" and lru.pop("b", 7) == 7 and lru.total_bytes == 2
    assert "a" in lru and "b" not in lru and len(lru) == 1
    lru.clear()
    assert len(lru) == 0 and lru.total_bytes == 0 and list(lru.values()) == []


def test_the_byte_bound_drops_the_oldest_and_an_entry_alone_beyond_it():
    lru = LRU(max_bytes=10, nbytes=len)
    lru.put("a", "12345")
    lru.put("b", "1234")
    lru.put("c", "12")                             # 11 bytes: "a" goes
    assert list(lru) == ["b", "c"] and lru.total_bytes == 6
    lru.put("b", "1234567")                        # replaced: its old size no longer counts
    assert list(lru) == ["c", "b"] and lru.total_bytes == 9
    lru.put("d", "x" * 11)                         # larger than the bound: nothing stays
    assert len(lru) == 0 and lru.total_bytes == 0


def test_a_byte_bound_needs_the_sizes():
    with pytest.raises(ValueError, match="nbytes"):
        LRU(max_bytes=10)
    assert LRU().total_bytes == 0


def test_bounds_may_change():
    lru = LRU(max_entries=4)
    for k in range(4):
        lru.put(k, k)
    lru.max_entries = 2                            # holds from the next put
    assert len(lru) == 4
    lru.put(9, 9)
    assert list(lru) == [3, 9]


class Model:
    """The reference: [key, value] pairs, least recently used first, every rule spelled out."""

    def __init__(self, max_entries, max_bytes, nbytes):
        self.pairs, self.max_entries, self.max_bytes, self.nbytes = [], max_entries, \
            max_bytes, nbytes

    def _find(self, key):
        return next((i for i, (k, _) in enumerate(self.pairs) if k == key), None)

    def total(self):
        return sum(self.nbytes(v) for _, v in self.pairs) if self.nbytes else 0

    def get(self, key, default):
        i = self._find(key)
        if i is None:
            return default
        self.pairs.append(self.pairs.pop(i))
        return self.pairs[-1][1]

    def peek(self, key, default):
        i = self._find(key)
        return default if i is None else self.pairs[i][1]

    def put(self, key, value, touch):
        i = self._find(key)
        if i is None:
            self.pairs.append([key, value])
        else:
            self.pairs[i][1] = value
            if touch:
                self.pairs.append(self.pairs.pop(i))
        while self.pairs and (
                (self.max_entries is not None and len(self.pairs) > self.max_entries) or
                (self.max_bytes is not None and self.total() > self.max_bytes)):
            self.pairs.pop(0)

    def pop(self, key, default):
        i = self._find(key)
        return default if i is None else self.pairs.pop(i)[1]

    def move_to_end(self, key):
        i = self._find(key)
        if i is None:
            raise KeyError(key)
        self.pairs.append(self.pairs.pop(i))


keys = st.integers(0, 7)
operations = st.lists(st.one_of(
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("peek"), keys),
    st.tuples(st.just("put"), keys, st.integers(0, 40), st.booleans()),
    st.tuples(st.just("pop"), keys),
    st.tuples(st.just("move_to_end"), keys),
    st.tuples(st.just("contains"), keys),
    st.tuples(st.just("clear"))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(max_entries=st.one_of(st.none(), st.integers(0, 5)),
       max_bytes=st.one_of(st.none(), st.integers(0, 120)), sized=st.booleans(), ops=operations)
def test_any_sequence_of_operations_matches_the_reference(max_entries, max_bytes, sized, ops):
    """Values are their own sizes (with ``sized``): every answer, the order, the count and
    the bytes held agree with the model after each operation."""
    nbytes = (lambda v: v) if sized or max_bytes is not None else None
    lru, model = LRU(max_entries, max_bytes, nbytes), Model(max_entries, max_bytes, nbytes)
    for op, *args in ops:
        if op == "get":
            assert lru.get(args[0], MISSING) == model.get(args[0], MISSING)
        elif op == "peek":
            assert lru.peek(args[0], MISSING) == model.peek(args[0], MISSING)
        elif op == "put":
            key, value, touch = args
            lru.put(key, value, touch=touch)
            model.put(key, value, touch)
        elif op == "pop":
            assert lru.pop(args[0], MISSING) == model.pop(args[0], MISSING)
        elif op == "move_to_end":
            try:
                model.move_to_end(args[0])
            except KeyError:
                with pytest.raises(KeyError):
                    lru.move_to_end(args[0])
            else:
                lru.move_to_end(args[0])
        elif op == "contains":
            assert (args[0] in lru) == (model._find(args[0]) is not None)
        else:
            lru.clear()
            model.pairs.clear()
        assert [list(p) for p in lru.items()] == model.pairs
        assert list(lru.keys()) == [k for k, _ in model.pairs] == list(lru)
        assert list(lru.values()) == [v for _, v in model.pairs]
        assert len(lru) == len(model.pairs) and lru.total_bytes == model.total()
