"""addon/records/token_ids.py: packing checks every id in C, the Arrow view shares the buffer, and the JSON list is what
``json.dumps`` writes (property test)."""

from __future__ import annotations

import json
import pickle
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from addon.records import token_ids

IDS = st.lists(st.integers(0, token_ids.INT32_MAX), max_size=600)  # a call's usual new suffix


@given(IDS)
def test_json_list_is_the_compact_json_of_the_ids(ids: list[int]) -> None:
    text = token_ids.json_list(ids)
    assert text == json.dumps(ids, separators=(",", ":"))
    assert json.loads(text) == ids
    assert token_ids.json_list(array("i", ids)) == text


@pytest.mark.parametrize("n", [token_ids.ARROW_JSON, token_ids.ARROW_JSON + 1, 3 * token_ids.ARROW_JSON + 7])
def test_json_list_is_the_same_on_both_sides_of_arrows_threshold(n: int) -> None:
    ids = [(i * 2_654_435_761) % (token_ids.INT32_MAX + 1) for i in range(n)]  # every digit count, 0 first
    text = token_ids.json_list(ids)
    assert text == json.dumps(ids, separators=(",", ":"))
    assert token_ids.json_bytes(array("i", ids)) == text.encode()


@pytest.mark.parametrize("n", [1, 2, 255, token_ids.SIGN_BYTES, token_ids.SIGN_BYTES + 1, 3 * token_ids.SIGN_BYTES])
@pytest.mark.parametrize("bad", [-1, -(2**31), -256, -(2**24)])
def test_a_negative_id_is_found_wherever_it_is(n: int, bad: int) -> None:
    """The sign check (the ids' top bytes up to SIGN_BYTES ids, Arrow's min past it) at the first, a middle and the
    last place, for values whose other bytes are all zero or all set."""
    for at in {0, n // 2, n - 1}:
        ids = array("i", [2**31 - 1] * n)
        ids[at] = bad
        with pytest.raises(ValueError, match=rf"got {bad}\.\."):
            token_ids.pack(ids, "prompt_ids")


def test_a_packed_array_is_used_as_it_is_and_viewed_without_a_copy() -> None:
    packed = array("i", [5, 6, 7])
    assert token_ids.pack(packed) is packed
    view = token_ids.arrow(packed)
    assert view.to_pylist() == [5, 6, 7]
    assert view.buffers()[1].address == packed.buffer_info()[0]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([1, -2, 3], r"prompt_ids must hold token ids in \[0, 2\*\*31\); got -2\.\.3"),
        (array("i", [4, -1]), r"got -1\.\.4"),
        (array("i", [7] * token_ids.SIGN_BYTES + [-3]), r"got -3\.\.7"),  # past the sign bytes: Arrow's min and max
        ([2**31], r"got \[2147483648\]"),
        ([1, "2"], r"got \['2'\]"),
        ([True, 0.5], r"got \[0\.5\]"),
    ],
)
def test_what_is_not_a_token_id_is_named(ids, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        token_ids.pack(ids, "prompt_ids")


def test_empty() -> None:
    assert len(token_ids.pack(())) == 0
    assert token_ids.json_list(()) == "[]"


@given(IDS, IDS, st.booleans())
def test_json_ids_extending_list_the_ids_whatever_came_before(head: list[int], tail: list[int], related: bool) -> None:
    """A session's next prompt usually extends its last one (only the new ids are formatted); when it does not (a
    fork, a retry, an unrelated call) the list is still exactly json_list of the new ids."""
    earlier = token_ids.JsonIds.of(array("i", head))
    ids = array("i", head + tail) if related else array("i", tail)
    assert token_ids.JsonIds.extending(ids, earlier).data == token_ids.json_list(ids).encode()
    assert token_ids.JsonIds.extending(ids, None).text == token_ids.json_list(ids)


def test_json_ids_extending_formats_only_the_new_ids() -> None:
    """Measured by what it is given: an earlier list that is not the ids' own JSON shows through when reused."""
    head = token_ids.JsonIds._made(array("i", [1, 2, 3]), b"[HEAD]")
    assert token_ids.JsonIds.extending(array("i", [1, 2, 3, 4]), head).data == b"[HEAD,4]"
    assert token_ids.JsonIds.extending(array("i", [1, 2, 3]), head).data == b"[HEAD]"
    assert token_ids.JsonIds.extending(array("i", [1, 2, 4, 4]), head).data == b"[1,2,4,4]"


@given(st.lists(st.integers(0, 2**31 - 1), max_size=50), st.lists(st.integers(0, 2**31 - 1), max_size=5))
def test_frozen_ids_behave_as_the_tuple_of_their_ids(ids: list[int], more: list[int]) -> None:
    frozen = token_ids.FrozenIds(array("i", ids))
    assert frozen == tuple(ids) and tuple(ids) == frozen and frozen == ids and frozen == token_ids.FrozenIds(ids)
    assert len(frozen) == len(ids) and list(frozen) == ids and hash(frozen) == hash(tuple(ids))
    assert frozen[1:3] == tuple(ids[1:3]) and (not ids or frozen[-1] == ids[-1])
    assert frozen + tuple(more) == tuple(ids + more) and tuple(more) + frozen == tuple(more + ids)
    assert frozen != tuple([*ids, 7]) and frozen != "not ids"
    assert pickle.loads(pickle.dumps(frozen)) == frozen


def test_frozen_ids_keep_their_own_copy_and_refuse_what_is_not_a_token_id() -> None:
    source = array("i", [5, 6, 7])
    frozen = token_ids.FrozenIds(source)
    source[0] = 99  # whoever handed the array on cannot change the record's ids
    assert frozen == (5, 6, 7) and frozen.packed is not source
    with pytest.raises(ValueError, match="prompt_ids must hold token ids"):
        token_ids.FrozenIds(array("i", [1, -2]), "prompt_ids")


def test_adopted_ids_are_held_without_a_copy() -> None:
    built = array("i", [1, 2, 3])
    frozen = token_ids.FrozenIds.adopt(built)
    assert frozen.packed is built and frozen == (1, 2, 3)
    assert token_ids.pack(frozen) is built  # checked when made: handed out as it is
    with pytest.raises(TypeError, match="array"):
        token_ids.FrozenIds.adopt((1, 2, 3))  # type: ignore[arg-type]


def test_json_ids_are_made_with_their_list_and_only_by_their_constructors() -> None:
    head = token_ids.JsonIds.of([5, 6, 7])
    assert (head.text, list(head.ids)) == ("[5,6,7]", [5, 6, 7])
    longer = token_ids.JsonIds.extending(array("i", [5, 6, 7, 8]), head)
    assert longer.text == "[5,6,7,8]" and longer.lists(array("i", [5, 6, 7, 8])) and not longer.lists(head.ids)
    assert token_ids.JsonIds.extending(array("i", [1, 2]), head).text == "[1,2]"  # not a prefix: the whole list
    assert token_ids.JsonIds.extending(array("i", [9]), None).text == "[9]"
    with pytest.raises(TypeError, match="JsonIds.of or JsonIds.extending"):
        token_ids.JsonIds()
    with pytest.raises(TypeError, match="array"):
        token_ids.JsonIds.extending([1, 2], None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="token ids"):
        token_ids.JsonIds.of([1, -2])
