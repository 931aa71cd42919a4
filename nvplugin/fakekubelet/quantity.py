"""Kubernetes resource quantities (``500m``, ``2Gi``, ``1e3``) read the way the API server and
the kubelet read them, in time and memory bounded by the length of the text, whatever it says.

What is accepted is what the API server's parser (apimachinery ``resource.ParseQuantity``)
accepts. Its scanner reads an optional sign, digits, an optional ``.`` and digits, then a suffix:
a run of the letters ``eEinumkKMGTP``, an optional sign and digits, and nothing after. The
suffix must be a decimal one (``n u m k M G T P E`` or none), a binary one (``Ki Mi Gi Ti Pi
Ei``) or ``e``/``E`` and a whole exponent. The parser's quirks carry over: a number without
digits is zero where its fast path reads it (``+``, ``.``, ``Ki``, ``e5``) and an error where its
exact path does (``Pi``, ``Ei``, an exponent below -9); only the empty text is always an error.
One deliberate difference: an exponent must fit the parser's 32-bit scale. Released parsers
reduce a bigger one modulo 2^32 (``1e4294967297`` reads as 10) or, near the edges, never finish;
upstream treats both as bugs whose fix is to refuse them (kubernetes#141203), and so do we.

The value is exact (a :class:`~decimal.Decimal` keeps coefficient and exponent apart, so
``1e999999999`` costs what ``1`` does), after the two adjustments Kubernetes makes when parsing:
a non-zero value finer than ``1n`` (10^-9) is rounded away from zero to a multiple of ``1n``, and
a value with a binary suffix is capped at 2^63-1 in magnitude. Decimal values are not capped:
``1e30`` is 10^30.

The kubelet mostly reads quantities as 64-bit integers (``Value()``, ``MilliValue()``): rounded
away from zero and, past the int64 range, saturated at its limits, as apimachinery does since
its overflow fixes (kubernetes#141166; older releases wrapped or returned 0). So ``1e30`` GPUs
would be 2^63-1 GPUs, not 0; but its milli-value is then not a multiple of 1000, so the API server
refuses it first ("must be an integer"; :attr:`Quantity.whole_number` is None).

Sums (pod requests, QoS totals) are exact up to :data:`SUM_DIGITS` significant digits and
rounded away from zero beyond: an exact ``1e999999999 + 1n`` has a billion digits (the real
kubelet would stall on it), and no int64 view of such a sum changes.

The API server's defaulting then rounds every quantity of a pod's resource lists up to ``1m``
(10^-3) before anyone else sees the pod (:func:`round_up_to_milli`): ``1999999999n`` is ``2``.

Public API: :class:`Quantity`, :func:`parse_quantity`, :func:`round_up_to_milli`, :func:`add`,
:func:`int64_value`, :data:`INT64_MAX`, :data:`INT64_MIN`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, ROUND_UP, Context, Decimal, InvalidOperation

from nvplugin.errors import shortened

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
SUM_DIGITS = 1000
"""Significant digits a sum of quantities keeps exactly."""

_SCALE_MIN, _SCALE_MAX = -(2**31), 2**31 - 1
"""The decimal exponents the parser's 32-bit scale holds."""
_NANO = -9
"""Kubernetes keeps no digit finer than 10^-9."""
_MILLI = -3
"""Nor, in a pod's resource lists, finer than 10^-3 (the API server's defaulting)."""
_DECIMAL_SUFFIXES = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18
}  # fmt: skip
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_GRAMMAR = re.compile(r"([+-]?+)([0-9]*+)(?:\.([0-9]*+))?+([eEinumkKMGTP]*+[+-]?+[0-9]*+)")
"""The parser's scanner: sign, digits, ``.`` and digits, then a suffix of unit letters, a sign
and digits. Possessive (``*+``), like the scanner, which never goes back: linear time on any
text, where a backtracking match of ``"1" * 10**6 + "x"`` would take quadratic time."""
_EXPONENT = re.compile(r"[eE]([+-]?)0*([0-9]+)")
_SHOWN = 40
"""Characters of a quantity an error message shows."""


def _context(digits: int = MAX_PREC) -> Context:
    """Arithmetic on quantities: any exponent, ``digits`` significant digits, rounding away from
    zero, an error rather than a NaN. The default never rounds; it is for operations whose exact
    result is small by construction (shifts, products with a power of two, rounding to whole
    numbers), and costs only what the result needs."""
    return Context(
        prec=digits, rounding=ROUND_UP, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[InvalidOperation]
    )


@dataclass(frozen=True, slots=True)
class Quantity:
    """A quantity: its exact value (after Kubernetes' rounding and cap) and its text."""

    value: Decimal
    text: str

    @property
    def int_value(self) -> int:
        """Kubernetes ``Value()``: rounded away from zero, saturated at the int64 limits (device
        counts, memory in bytes)."""
        return int64_value(self.value)

    @property
    def milli_value(self) -> int:
        """Kubernetes ``MilliValue()``: thousandths, rounded away from zero, saturated (cpu in
        millicores)."""
        return int64_value(self.value, -3)

    @property
    def whole_number(self) -> int | None:
        """:attr:`int_value` when Kubernetes counts this as an integer (its milli-value is a
        multiple of 1000, so ``0.9999`` is 1 and ``1e30`` is not one), else None."""
        return self.int_value if self.milli_value % 1000 == 0 else None

    def __str__(self) -> str:
        return shortened(self.text, _SHOWN)


def parse_quantity(text: str) -> Quantity:
    """Parse a quantity as the API server does; ValueError says what is wrong with it."""
    shown = f'"{shortened(text, _SHOWN)}"'
    negative, whole, fraction, suffix = _scan(text, shown)
    base, exponent = _suffix(suffix, shown)
    digits = (whole + fraction).lstrip("0")
    if not whole and not fraction:
        if (base == 10 and exponent < _NANO) or (base == 2 and exponent >= 50):
            # The parser's exact path reads the number itself, and there is none.
            raise ValueError(f"{shown} has no digits")
        return Quantity(Decimal(0), text)
    if not digits:
        return Quantity(Decimal(0), text)
    sign = "-" if negative else ""
    if base == 10:
        scale = exponent - len(fraction)
        value = Decimal(f"{sign}{digits}E{scale}")
    else:
        scale = -len(fraction)
        value = _context().multiply(Decimal(f"{sign}{digits}E{scale}"), Decimal(2**exponent))
    if scale < _NANO:
        value = _round_to_nano(value)
    if base == 2 and value.copy_abs() > INT64_MAX:
        value = Decimal(-INT64_MAX if negative else INT64_MAX)
    return Quantity(value, text)


def round_up_to_milli(quantity: Quantity) -> Quantity:
    """The quantity as the API server stores it in a pod's requests, limits or overhead: its
    defaulting (``SetDefaults_ResourceList``) rounds each value away from zero to a multiple of
    ``1m``. The text is kept, for messages."""
    value = quantity.value
    exponent = value.as_tuple().exponent
    if value.is_zero() or not isinstance(exponent, int) or exponent >= _MILLI:
        return quantity
    # The value is a multiple of 1n (parse_quantity), so at most 6 digits go.
    return Quantity(value.quantize(Decimal(f"1E{_MILLI}"), context=_context()), quantity.text)


def add(a: Decimal, b: Decimal) -> Decimal:
    """``a + b``: exact up to :data:`SUM_DIGITS` significant digits, rounded away from zero
    beyond (see the module docstring)."""
    return _context(SUM_DIGITS).add(a, b)


def int64_value(value: Decimal, scale: int = 0) -> int:
    """Kubernetes ``ScaledValue(scale)``: ``value / 10^scale`` rounded away from zero, saturated
    at the int64 limits."""
    if value.is_zero():
        return 0
    if value.adjusted() - scale >= 19:  # |value / 10^scale| >= 10^19 > 2^63
        return INT64_MAX if value > 0 else INT64_MIN
    context = _context()
    shifted = context.scaleb(value.copy_abs(), Decimal(-scale))
    whole = int(context.to_integral_value(shifted))
    return min(whole, INT64_MAX) if value > 0 else max(-whole, INT64_MIN)


def _scan(text: str, shown: str) -> tuple[bool, str, str, str]:
    """The parser's scanner: (negative, whole digits, fraction digits, suffix)."""
    if not text:
        raise ValueError("an empty quantity (a number and an optional unit, like 500m or 2Gi)")
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        raise ValueError(
            f"{shown} is not a quantity (a number and an optional unit, like 500m, 2Gi or 1e3)"
        )
    sign, whole, fraction, suffix = match.groups(default="")
    return sign == "-", whole, fraction, suffix


def _suffix(suffix: str, shown: str) -> tuple[int, int]:
    """(base, exponent) of a suffix: ``k`` is (10, 3), ``Mi`` (2, 20), ``e-2`` (10, -2)."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix]
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix]
    if match := _EXPONENT.fullmatch(suffix):
        sign, digits = match.groups()
        exponent = int(f"{sign}{digits}") if len(digits) <= 10 else None
        if exponent is None or not _SCALE_MIN <= exponent <= _SCALE_MAX:
            raise ValueError(
                f"{shown}: the exponent is out of range ({_SCALE_MIN} to {_SCALE_MAX})"
            )
        return 10, exponent
    raise ValueError(
        f'{shown} has an unknown unit "{shortened(suffix, _SHOWN)}" '
        "(one of n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or e and an exponent)"
    )


def _round_to_nano(value: Decimal) -> Decimal:
    """Round a value with digits finer than 10^-9 away from zero to a multiple of 10^-9."""
    if value.adjusted() < _NANO:  # all of it finer than 1n: the parser gives 1n
        return Decimal(f"{'-' if value < 0 else ''}1E{_NANO}")
    # At most adjusted() + 10 digits remain, one more if rounding carries: fewer than value has.
    return value.quantize(Decimal(f"1E{_NANO}"), context=_context())
