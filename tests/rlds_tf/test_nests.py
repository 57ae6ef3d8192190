"""rlds_tf.nests: the one formatter of nest paths in both packages' messages, and lists read as tuples."""
import collections

import pytest

from rlds_tf import nests

Point = collections.namedtuple("Point", ["x", "y"])


@pytest.mark.parametrize("path, kwargs, want", [
    ((), {}, "<root>"),
    (("observation", "pos"), {}, "observation/pos"),
    (("steps", 0, "obs"), {}, "steps/0/obs"),
    (("a",), {"notation": "slashes"}, "a"),
    ((), {"notation": "subscripts"}, "<root>"),
    (("obs", 0), {"notation": "subscripts"}, "['obs'][0]"),
    ((1, nests.FieldName("camera")), {"notation": "subscripts", "root": "items"}, "items[1].camera"),
    ((), {"notation": "subscripts", "root": "items"}, "items"),
    ((nests.FieldName("x"), "k"), {}, "x/k"),
])
def test_format_path(path, kwargs, want):
    assert nests.format_path(path, **kwargs) == want


@pytest.mark.parametrize("kwargs, match", [
    ({"notation": "dots"}, r"notation must be 'slashes' or 'subscripts', got 'dots'"),
    ({"root": "items"}, r"root \('items'\) is written only with notation='subscripts'"),
])
def test_format_path_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        nests.format_path(("a",), **kwargs)


@pytest.mark.parametrize("nest, want", [
    ([1, [2, 3]], (1, (2, 3))),
    ({"a": [1], "b": ({"c": [2]},)}, {"a": (1,), "b": ({"c": (2,)},)}),
    (Point([1, 2], 3), Point((1, 2), 3)),
    (collections.OrderedDict([("b", [1]), ("a", 2)]), collections.OrderedDict([("b", (1,)), ("a", 2)])),
    (5, 5),
    (None, None),
])
def test_lists_to_tuples(nest, want):
    got = nests.lists_to_tuples(nest)
    assert got == want
    assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)  # (key order kept)


def test_lists_to_tuples_keeps_a_defaultdict_and_its_factory():
    got = nests.lists_to_tuples(collections.defaultdict(list, {"a": [1, [2]]}))
    assert type(got) is collections.defaultdict and got == {"a": (1, (2,))}
    assert got["missing"] == []


def test_lists_to_tuples_leaves_the_input_alone():
    nest = {"a": [1, [2]]}
    nests.lists_to_tuples(nest)
    assert nest == {"a": [1, [2]]}
