import pytest

from nvplugin.fakekubelet.topologymanager.bitmask import (
    BitMask,
    and_masks,
    iterate_bitmasks,
    or_masks,
)


def test_set_operations_return_new_masks() -> None:
    a = BitMask.of(0, 2)
    assert a.add(1).get_bits() == (0, 1, 2)
    assert a.remove(0).get_bits() == (2,)
    assert a.get_bits() == (0, 2)  # unchanged: immutable
    assert (a & BitMask.of(2, 3)).get_bits() == (2,)
    assert (a | BitMask.of(3)).get_bits() == (0, 2, 3)
    assert and_masks(BitMask.of(0, 1, 2), BitMask.of(1, 2), BitMask.of(2)) == BitMask.of(2)
    assert or_masks(BitMask(), BitMask.of(5), BitMask.of(63)).get_bits() == (5, 63)


def test_queries() -> None:
    a = BitMask.of(1, 3)
    assert a.count() == 2 and len(a) == 2
    assert a.is_set(3) and not a.is_set(0) and not a.is_set(64) and not a.is_set(-1)
    assert a.any_set([0, 3]) and not a.any_set([0, 2])
    assert BitMask().is_empty() and not a.is_empty()
    assert a.is_equal(BitMask.of(3, 1))
    assert list(a) == [1, 3] and 3 in a
    assert str(a) == "{1,3}" and repr(a) == "BitMask.of(1, 3)"


def test_bits_outside_0_63_are_rejected() -> None:
    with pytest.raises(ValueError, match="bit number must be in range 0-63"):
        BitMask.of(64)
    with pytest.raises(ValueError, match="bit number must be in range 0-63"):
        BitMask.of(0).add(-1)


@pytest.mark.parametrize(
    ("first", "second", "narrower"),
    [
        ((0,), (0, 1), True),  # fewer bits
        ((0, 1), (0,), False),
        ((0, 1), (0, 2), True),  # same count: numerically lower wins
        ((1, 2), (0, 3), True),  # 0b0110 < 0b1001
        ((0, 3), (1, 2), False),
        ((0, 1), (0, 1), False),  # equal: not narrower
    ],
)
def test_is_narrower_than(first: tuple[int, ...], second: tuple[int, ...], narrower: bool) -> None:
    assert BitMask.of(*first).is_narrower_than(BitMask.of(*second)) is narrower


def test_less_and_greater_are_numeric() -> None:
    assert BitMask.of(1, 2).is_less_than(BitMask.of(3))
    assert BitMask.of(3).is_greater_than(BitMask.of(0, 1, 2))
    assert not BitMask.of(0).is_less_than(BitMask.of(0))


def test_iterate_bitmasks_in_kubelet_order() -> None:
    masks = [m.get_bits() for m in iterate_bitmasks([0, 1, 2])]
    assert masks == [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)]
    assert [m.get_bits() for m in iterate_bitmasks([0, 1, 2], 2)] == [(0, 1), (0, 2), (1, 2)]
    assert list(iterate_bitmasks([0, 1], 3)) == []
    assert len(list(iterate_bitmasks(list(range(8))))) == 255
