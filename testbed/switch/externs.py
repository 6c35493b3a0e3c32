"""Stateful objects of a v1model program: counters, meters, registers and parser value sets."""

from __future__ import annotations

import threading
from collections.abc import Callable

# Meter colours, as v1model / bmv2 report them.
GREEN, YELLOW, RED = 0, 1, 2


class CounterArray:
    """Indexed (or direct, one cell per table entry) packet+byte counters."""

    def __init__(self, name: str, size: int, is_direct: bool = False, binding: str = ""):
        self.name = name
        self.size = size
        self.is_direct = is_direct
        self.binding = binding
        self.packets = [0] * size
        self.bytes = [0] * size

    def count(self, index: int, nbytes: int) -> None:
        if 0 <= index < self.size:
            self.packets[index] += 1
            self.bytes[index] += nbytes

    def read(self, index: int) -> tuple[int, int]:
        self._check(index)
        return self.packets[index], self.bytes[index]

    def write(self, index: int, packets: int, nbytes: int) -> None:
        self._check(index)
        self.packets[index] = packets
        self.bytes[index] = nbytes

    def reset(self) -> None:
        self.packets = [0] * self.size
        self.bytes = [0] * self.size

    def _check(self, index: int) -> None:
        if not 0 <= index < self.size:
            raise IndexError(f"counter {self.name}: index {index} out of range [0, {self.size})")


class Meter:
    """A two-rate three-colour marker (RFC 2698) with bmv2's token arithmetic.

    Rates are given as (info_rate per microsecond, burst size), committed first then peak, in
    bytes or packets. An unconfigured meter marks everything GREEN, as in bmv2.
    """

    __slots__ = ("rates", "configured")

    def __init__(self) -> None:
        # per rate: [info_rate, burst, tokens, tokens_last, colour], peak rate first
        self.rates: list[list[float]] = []
        self.configured = False

    def set_rates(self, configs: list[tuple[float, int]]) -> None:
        if configs and any(configs[i][0] > configs[i + 1][0] for i in range(len(configs) - 1)):
            raise ValueError("meter rates must be non-decreasing (committed <= peak)")
        self.rates = [[r, b, b, 0, i + 1] for i, (r, b) in enumerate(configs)]
        self.rates.reverse()
        self.configured = bool(configs)

    def get_rates(self) -> list[tuple[float, int]]:
        return [(r[0], int(r[1])) for r in reversed(self.rates)] if self.configured else []

    def reset(self) -> None:
        self.rates = []
        self.configured = False

    def execute(self, now_us: int, amount: int, pre_color: int = GREEN) -> int:
        if not self.configured:
            return pre_color
        color = GREEN
        for rate in self.rates:
            since_init = int(now_us * rate[0])
            new_tokens = since_init - rate[3]
            rate[3] = since_init
            rate[2] = min(rate[2] + new_tokens, rate[1])
            if rate[2] < amount:
                color = int(rate[4])
                break
            rate[2] -= amount
        return max(pre_color, color)


class MeterArray:
    def __init__(
        self,
        name: str,
        size: int,
        unit: str,
        clock: Callable[[], int],
        is_direct: bool = False,
        binding: str = "",
        rate_count: int = 2,
    ):
        self.name = name
        self.size = size
        self.unit = unit  # "bytes" or "packets"
        self.is_direct = is_direct
        self.binding = binding
        self.rate_count = rate_count
        self.clock = clock  # microseconds since the switch started
        self.meters = [Meter() for _ in range(size)]

    def execute(self, index: int, nbytes: int) -> int:
        if not 0 <= index < self.size:
            return GREEN
        amount = nbytes if self.unit == "bytes" else 1
        return self.meters[index].execute(self.clock(), amount)

    def meter(self, index: int) -> Meter:
        if not 0 <= index < self.size:
            raise IndexError(f"meter {self.name}: index {index} out of range [0, {self.size})")
        return self.meters[index]


class RegisterArray:
    def __init__(self, name: str, size: int, bitwidth: int):
        self.name = name
        self.size = size
        self.bitwidth = bitwidth
        self.mask = (1 << bitwidth) - 1
        self.values = [0] * size
        # Actions touching registers run under this lock so that control-plane reads see whole
        # updates (bmv2 locks registers per action the same way).
        self.lock = threading.Lock()

    def read(self, index: int) -> int:
        self._check(index)
        return self.values[index]

    def write(self, index: int, value: int) -> None:
        self._check(index)
        self.values[index] = value & self.mask

    def reset(self) -> None:
        self.values = [0] * self.size

    def _check(self, index: int) -> None:
        if not 0 <= index < self.size:
            raise IndexError(f"register {self.name}: index {index} out of range [0, {self.size})")


class ValueSet:
    """A parser value set: values are stored byte-padded per field, as transition keys are."""

    def __init__(self, name: str, bitwidths: list[int], max_size: int = 0):
        self.name = name
        self.bitwidths = bitwidths
        self.max_size = max_size
        self.values: set[int] = set()

    def padded(self, compressed: int) -> int:
        """Convert a value given as the plain concatenation of the key fields (P4Runtime /
        CLI form) to the byte-padded form the parser compares against."""
        if len(self.bitwidths) <= 1:
            return compressed
        out = 0
        shift = sum(self.bitwidths)
        for w in self.bitwidths:
            shift -= w
            part = (compressed >> shift) & ((1 << w) - 1)
            out = (out << (8 * ((w + 7) // 8))) | part
        return out

    def contains(self, key: int, mask: int | None) -> bool:
        if mask is None:
            return key in self.values
        key &= mask
        return any((v & mask) == key for v in self.values)
