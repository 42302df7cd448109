"""A pure, deterministic port of the scheduler's structured allocator, with explanations.

Allocation follows k8s.io/dynamic-resource-allocation structured/internal/incubating
(allocator_incubating.go, release-1.36: the allocator 1.36's default gates select): claims are
allocated in order, each request after the other; for every needed device the candidates are
tried pool by pool with backtracking, and the first complete solution wins. Class selectors are
evaluated before request selectors, lazily and cached per device and request; a CEL error aborts
allocation (the scheduler reports it as `class X: selector #i: CEL runtime error: ...`). Devices
are not shared between requests or claims unless a request has adminAccess (then only not within
the same claim) or the device allows multiple allocations (consumable capacity: each allocation
consumes part of its capacities, see `capacity`). `All` requests take every matching device,
`firstAvailable` subrequests are tried in order, `matchAttribute` constraints require one value
across the devices of the named requests, NoSchedule/NoExecute taints need a toleration, and
devices consuming shared counters must fit the pool's counters (what allocated claims' devices
consume is taken first; a device consuming a counter its pool does not
define makes the pool invalid).

Where the scheduler is not deterministic (it walks pools in Go map order) we are: pools sorted by
driver and name, slices by name, devices in slice order.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dradriver.offline.allocation.capacity import (
    Amount,
    Capacity,
    CapacityError,
    add_to,
    consumption,
    device_capacities,
    fits,
    parse_amount,
)
from dradriver.offline.allocation.model import (
    ALL,
    AllocatedDevice,
    Claim,
    Device,
    DeviceClass,
    DeviceRequest,
    Request,
    Slice,
)
from dradriver.offline.cel import CELCompileError, CELDevice, CELRuntimeError, compile_selector, to_cel_device
from dradriver.quantity import Quantity, QuantityError

# resourceapi.AllocationResultsMaxSize.
MAX_RESULTS_PER_CLAIM = 32
# Search steps between two looks at the clock.
_CLOCK_EVERY = 1024
# Share IDs are random UUIDs in the scheduler; ours are derived from the claim and the result.
_SHARE_NAMESPACE = uuid.UUID("1f0c8a52-3d4e-5b6a-9c7d-8e9f0a1b2c3d")


# -- report types ---------------------------------------------------------------------------------


@dataclass
class SelectorOutcome:
    """One selector on one device: "true", "false", "error" or "skipped" (not evaluated)."""

    source: str  # "class <name>" or "request"
    index: int
    expression: str
    outcome: str
    message: str = ""


@dataclass
class DeviceVerdict:
    device: str
    selectors: list[SelectorOutcome]
    matches: bool
    error: str | None = None


@dataclass
class RequestReport:
    """Per request (or subrequest): every device's selector outcomes."""

    request: str
    device_class: str
    mode: str
    count: int
    admin_access: bool
    devices: list[DeviceVerdict] = field(default_factory=list)
    selected: bool = False

    @property
    def matching(self) -> int:
        return sum(1 for d in self.devices if d.matches)


@dataclass
class ClaimReport:
    claim: Claim
    results: list[AllocatedDevice] = field(default_factory=list)
    requests: list[RequestReport] = field(default_factory=list)
    reason: str | None = None
    preallocated: bool = False


@dataclass
class NodeReport:
    node: str | None
    satisfiable: bool
    claims: list[ClaimReport]
    error: str | None = None
    reason: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class Simulation:
    """Outcomes per candidate node; `chosen` is the first node that satisfies every claim."""

    nodes: list[NodeReport]

    @property
    def chosen(self) -> NodeReport | None:
        return next((n for n in self.nodes if n.satisfiable), None)

    @property
    def satisfiable(self) -> bool:
        return self.chosen is not None


class AllocationError(Exception):
    """The scheduler would fail with this error (a CEL error, a missing class, ...)."""


class AllocationTimeoutError(AllocationError):
    """The search ran past its time limit, as the scheduler's does past its filter timeout."""


class _Exceeded:
    """errAllocationResultMaxSizeExceeded while searching (more than 32 results for a claim)."""


_EXCEEDED = _Exceeded()
_Outcome = bool | _Exceeded
_Frame = Generator[tuple[int, int, int, int, bool, tuple[int, int]], _Outcome, _Outcome]


# -- pools ------------------------------------------------------------------------------------------


@dataclass
class _Pool:
    driver: str
    name: str
    slices: list[Slice]
    incomplete: bool = False
    invalid: str | None = None
    counters: dict[str, dict[str, Quantity]] = field(default_factory=dict)
    _available: dict[tuple[str, str], int | Fraction] | None = None

    @property
    def available(self) -> dict[tuple[str, str], int | Fraction]:
        """Counter totals by (counter set, counter), as exact numbers."""
        if self._available is None:
            self._available = {
                (set_name, counter): _number(value)
                for set_name, counters in self.counters.items()
                for counter, value in counters.items()
            }
        return self._available

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"

    def devices(self) -> Iterable[Device]:
        for slice_ in self.slices:
            yield from slice_.devices

    @property
    def device_list(self) -> list[Device]:
        """Devices in allocation order (slices by name, devices in slice order), computed once."""
        cached: list[Device] | None = self.__dict__.get("_device_list")
        if cached is None:
            cached = list(self.devices())
            self.__dict__["_device_list"] = cached
        return cached


def _targets_node(slice_: Slice, node: str | None) -> bool:
    if slice_.all_nodes or slice_.node_selector:
        return True
    return node is None or slice_.node_name == node


def gather_pools(slices: Sequence[Slice], node: str | None) -> tuple[list[_Pool], list[str]]:
    """GatherPools: newest generation per pool, completeness, duplicate device names."""
    warnings: list[str] = []
    by_pool: dict[tuple[str, str], list[Slice]] = {}
    for slice_ in slices:
        if not _targets_node(slice_, node):
            continue
        if slice_.node_selector and not slice_.all_nodes:
            warnings.append(
                f"slice {slice_.name}: nodeSelector is not evaluated; assuming it selects the node"
            )
        key = (slice_.driver, slice_.pool)
        current = by_pool.get(key)
        if current is None or slice_.generation > current[0].generation:
            by_pool[key] = [slice_]
        elif slice_.generation == current[0].generation:
            current.append(slice_)
    pools: list[_Pool] = []
    for (driver, name), pool_slices in sorted(by_pool.items()):
        pool_slices.sort(key=lambda s: s.name)
        pool = _Pool(driver, name, pool_slices)
        if len(pool_slices) != pool_slices[0].slice_count:
            pool.incomplete = True
            warnings.append(
                f"pool {pool.id} is incomplete: {len(pool_slices)} of {pool_slices[0].slice_count} slices "
                f"at generation {pool_slices[0].generation}; its devices are not allocated"
            )
        seen: set[str] = set()
        for device in pool.devices():
            if device.name in seen:
                pool.invalid = f"duplicate device name {device.name}"
                warnings.append(f"pool {pool.id} is invalid: {pool.invalid}")
                break
            seen.add(device.name)
        for slice_ in pool_slices:
            for set_name, counters in slice_.shared_counters.items():
                parsed: dict[str, Quantity] = {}
                for counter, value in counters.items():
                    try:
                        parsed[counter] = Quantity.parse(str(_counter_value(value)))
                    except QuantityError as err:
                        pool.invalid = f"counter set {set_name}, counter {counter}: {err}"
                parsed_set = pool.counters.setdefault(set_name, {})
                parsed_set.update(parsed)
        if pool.invalid is None and (undefined := _undefined_counter(pool)) is not None:
            pool.invalid = undefined
            warnings.append(f"pool {pool.id} is invalid: {undefined}")
        pools.append(pool)
    return pools, warnings


def _undefined_counter(pool: _Pool) -> str | None:
    """A device consuming a counter its pool does not define makes the whole pool invalid."""
    for device in pool.devices():
        for entry in device.body.get("consumesCounters") or []:
            if not isinstance(entry, Mapping):
                continue
            set_name = str(entry.get("counterSet", ""))
            defined = pool.counters.get(set_name)
            if defined is None:
                return (
                    f"device {device.name} consumes counters of counter set {set_name}, which the pool lacks"
                )
            for counter in entry.get("counters") or {}:
                if counter not in defined:
                    return (
                        f"device {device.name} consumes counter {counter} of counter set {set_name}, "
                        "which does not define it"
                    )
    return None


def _number(quantity: Quantity) -> int | Fraction:
    """A quantity as an exact number; an int when it is whole (most counters), which is faster."""
    value = quantity.exact()
    return value.numerator if value.denominator == 1 else value


def _counter_value(value: Any) -> Any:
    return value.get("value") if isinstance(value, Mapping) else value


# -- the allocator ----------------------------------------------------------------------------------


@dataclass
class _RequestData:
    request: DeviceRequest
    parent: Request | None
    device_class: DeviceClass
    num_devices: int
    all_devices: list[tuple[_Pool, Device]] = field(default_factory=list)
    selected_sub: int = 0

    @property
    def name(self) -> str:
        return f"{self.parent.name}/{self.request.name}" if self.parent else self.request.name


class _MatchState:
    def __init__(self, attribute: str, requests: Sequence[str]) -> None:
        self.attribute = attribute
        self.requests = set(requests)
        self.value: tuple[str, Any] | None = None
        self.count = 0

    def applies(self, base: str, sub: str) -> bool:
        if not self.requests:
            return True
        return base in self.requests or (bool(sub) and f"{base}/{sub}" in self.requests)

    def add(self, base: str, sub: str, device: Device) -> bool:
        if not self.applies(base, sub):
            return True
        value = lookup_attribute(device, self.attribute)
        if value is None:
            return False
        # The first device sets what the others are compared with, whatever its kind.
        if self.count != 0 and (value[0] == "other" or not self._admits(value)):
            return False
        self._record(base, value)
        self.count += 1
        return True

    def _admits(self, value: tuple[str, Any]) -> bool:
        return value == self.value

    def _record(self, base: str, value: tuple[str, Any]) -> None:
        self.value = value

    def remove(self, base: str, sub: str) -> None:
        if self.applies(base, sub):
            self.count -= 1


class _DistinctState(_MatchState):
    """distinctAttributeConstraint, including its bookkeeping by request name: a later device of
    the same request replaces the earlier one's value, and removing a device forgets the
    request's value (constraint.go; what the scheduler does, so what we do)."""

    def __init__(self, attribute: str, requests: Sequence[str]) -> None:
        super().__init__(attribute, requests)
        self.values: dict[str, tuple[str, Any]] = {}

    def _admits(self, value: tuple[str, Any]) -> bool:
        return not any(value == seen for seen in self.values.values())

    def _record(self, base: str, value: tuple[str, Any]) -> None:
        self.values[base] = value

    def remove(self, base: str, sub: str) -> None:
        if self.applies(base, sub):
            self.values.pop(base, None)
            self.count -= 1


def lookup_attribute(device: Device, qualified: str) -> tuple[str, Any] | None:
    """lookupAttribute: the fully qualified name, or the bare id when the domain is the driver."""
    attributes = device.body.get("attributes") or {}
    raw = attributes.get(qualified)
    if raw is None:
        domain, _, ident = qualified.partition("/")
        if domain != device.driver:
            return None
        raw = attributes.get(ident)
    if not isinstance(raw, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if raw.get(kind) is not None:
            return kind, raw[kind]
    return "other", None  # a list value: present, but equal to nothing


@dataclass(frozen=True)
class _Inventory:
    """What one node offers: classes, pools in allocation order, devices already taken."""

    classes: Mapping[str, DeviceClass]
    pools: list[_Pool]
    preallocated: set[str]
    outcomes: _Outcomes
    node: str | None = None
    # time.monotonic() past which the search gives up, as the scheduler does after its filter timeout.
    deadline: float | None = None
    # Devices allowing multiple allocations that allocated claims share, and what they consume.
    shared: set[str] = field(default_factory=set)
    shared_use: dict[str, dict[str, Fraction]] = field(default_factory=dict)


class _Allocator:
    def __init__(self, claims: Sequence[Claim], inventory: _Inventory) -> None:
        self.inventory = inventory
        self.claims = claims
        self.classes = inventory.classes
        self.pools = inventory.pools
        self.preallocated = inventory.preallocated
        self.shared = inventory.shared
        self.shared_use = inventory.shared_use
        self.outcomes = inventory.outcomes
        self.request_data: dict[tuple[int, int, int], _RequestData] = {}
        self.allocating: dict[str, set[int]] = {}
        self.results: list[list[AllocatedDevice]] = [[] for _ in claims]
        self.constraints: list[list[_MatchState]] = [
            [
                (_DistinctState if c.distinct else _MatchState)(c.attribute, c.requests)
                for c in claim.constraints
            ]
            for claim in claims
        ]
        self.consumed: dict[str, dict[tuple[str, str], int | Fraction]] = {}
        self._consumptions: dict[str, list[tuple[tuple[str, str], int | Fraction]]] = {}
        self._left: dict[str, dict[tuple[str, str], int | Fraction]] = {}
        self.matches: dict[tuple[int, int, int], dict[str, bool]] = {}
        self.allocating_capacity: dict[str, dict[str, Fraction]] = {}
        self._capacities: dict[str, dict[str, Capacity]] = {}
        self._consumptions_of: dict[
            tuple[str, tuple[tuple[str, str], ...]], tuple[dict[str, Amount] | None, bool]
        ] = {}

    # -- preparation (validateDeviceRequest) ----------------------------------------------------

    def prepare(self) -> None:
        for ci, claim in enumerate(self.claims):
            min_devices = 0
            for ri, request in enumerate(claim.requests):
                if request.first_available:
                    smallest = None
                    for si, sub in enumerate(request.first_available):
                        data = self._validate(claim, (ci, ri, si), sub, request)
                        self.request_data[(ci, ri, si)] = data
                        smallest = data.num_devices if smallest is None else min(smallest, data.num_devices)
                    min_devices += smallest or 0
                else:
                    assert request.exactly is not None
                    data = self._validate(claim, (ci, ri, 0), request.exactly, None)
                    self.request_data[(ci, ri, 0)] = data
                    min_devices += data.num_devices
            if min_devices > MAX_RESULTS_PER_CLAIM:
                raise AllocationError(
                    f"claim {claim.ref}: number of requested devices {min_devices} exceeds the claim limit "
                    f"of {MAX_RESULTS_PER_CLAIM}"
                )

    def _validate(
        self, claim: Claim, key: tuple[int, int, int], request: DeviceRequest, parent: Request | None
    ) -> _RequestData:
        shown = f"{parent.name}/{request.name}" if parent else request.name
        device_class = self.classes.get(request.device_class)
        if device_class is None:
            raise AllocationError(
                f"claim {claim.ref}, request {shown}: could not retrieve device class "
                f'{request.device_class}: deviceclass.resource.k8s.io "{request.device_class}" not found'
            )
        data = _RequestData(request, parent, device_class, request.count)
        if request.mode == ALL:
            for pool in self.pools:
                if pool.incomplete:
                    raise AllocationError(
                        f"claim {claim.ref}, request {shown}: asks for all devices, but resource pool "
                        f"{pool.id} is currently being updated"
                    )
                if pool.invalid:
                    raise AllocationError(
                        f"claim {claim.ref}, request {shown}: asks for all devices, but resource pool "
                        f"{pool.id} is currently invalid"
                    )
                for device in pool.devices():
                    if self.selectable(device, key, data) and self.capacity_left(device, request) is not None:
                        data.all_devices.append((pool, device))
            data.num_devices = len(data.all_devices)
        return data

    # -- selectors (isSelectable / selectorsMatch) -------------------------------------------------

    def selectable(self, device: Device, key: tuple[int, int, int], data: _RequestData) -> bool:
        cache = self.matches.setdefault(key, {})
        cached = cache.get(device.id)
        if cached is not None:
            return cached
        claim = self.claims[key[0]]
        result = self._selectors_match(
            device, data.device_class.selectors, f"class {data.device_class.name}"
        ) and self._selectors_match(device, data.request.selectors, f"claim {claim.ref}")
        cache[device.id] = result
        return result

    def _selectors_match(self, device: Device, selectors: Sequence[str], owner: str) -> bool:
        for i, expression in enumerate(selectors):
            outcome = self.outcomes.of(expression, device)
            if outcome[0] == "error":
                kind = "CEL compile error" if outcome[2] else "CEL runtime error"
                raise AllocationError(f"{owner}: selector #{i}: {kind}: {outcome[1]}")
            if outcome[0] == "false":
                return False
        return True

    # -- search (allocateOne) ----------------------------------------------------------------------

    def in_use(self, device_id: str) -> bool:
        return device_id in self.preallocated or bool(self.allocating.get(device_id))

    def allocate(self) -> bool:
        """allocateOne from the first claim, run on an explicit stack: one frame per device
        allocated, so thousands of claims need no Python recursion."""
        stack = [self._allocate_one(0, 0, 0, 0, False, (0, 0))]
        answer: _Outcome | None = None  # None: a new frame starts; else the callee's outcome
        deadline, steps = self.inventory.deadline, 0
        while stack:
            steps += 1
            if deadline is not None and steps % _CLOCK_EVERY == 0 and time.monotonic() > deadline:
                node = self.inventory.node or "(any)"
                raise AllocationTimeoutError(f"node {node}: timed out trying to allocate devices")
            frame = stack[-1]
            try:
                call = next(frame) if answer is None else frame.send(answer)
            except StopIteration as done:
                stack.pop()
                answer = done.value
                continue
            stack.append(self._allocate_one(*call))
            answer = None
        return answer is True

    def _allocate_one(  # noqa: PLR0917 - called with the frame tuple it yields
        self, ci: int, ri: int, si: int, di: int, in_subrequest: bool, start: tuple[int, int]
    ) -> _Frame:
        """allocator_incubating.go allocateOne; `yield args` stands for the recursive call.

        Returns True, False or _EXCEEDED (errAllocationResultMaxSizeExceeded, which a claim
        boundary turns into False and which makes firstAvailable try the next subrequest)."""
        if ci >= len(self.claims):
            return True
        claim = self.claims[ci]
        if ri >= len(claim.requests):
            outcome = yield (ci + 1, 0, 0, 0, False, (0, 0))
            return False if outcome is _EXCEEDED else outcome
        key = (ci, ri, si)
        data = self.request_data[key]
        if not in_subrequest and data.parent is not None:
            return (yield from self._first_available(ci, ri, di))
        request = data.request
        if request.mode == ALL and not data.all_devices:
            return False
        if di >= data.num_devices:
            return (yield (ci, ri + 1, 0, 0, False, (0, 0)))
        if len(self.results[ci]) + data.num_devices - di > MAX_RESULTS_PER_CLAIM:
            return _EXCEEDED
        if request.mode == ALL:
            return (yield from self._allocate_all(key, di, in_subrequest))
        return (yield from self._allocate_next(key, di, in_subrequest, start))

    def _first_available(self, ci: int, ri: int, di: int) -> _Frame:
        """A request with firstAvailable: its subrequests in order until one allocates."""
        all_exceeded = True
        sub = 0
        while (ci, ri, sub) in self.request_data:
            outcome = yield (ci, ri, sub, di, True, (0, 0))
            sub += 1
            if outcome is _EXCEEDED:
                continue
            all_exceeded = False
            if outcome is True:
                self.request_data[(ci, ri, 0)].selected_sub = sub - 1
                return True
        return _EXCEEDED if all_exceeded else False

    def _allocate_all(self, key: tuple[int, int, int], di: int, in_subrequest: bool) -> _Frame:
        """allocationMode All: device `di` of the request's list, which must be taken."""
        ci, ri, si = key
        pool, device = self.request_data[key].all_devices[di]
        undo = self.allocate_device(ci, key, pool, device, must=True)
        if undo is None:
            return False
        outcome = yield (ci, ri, si, di + 1, in_subrequest, (0, 0))
        if outcome is not True:
            undo()
            return False if outcome is False else outcome
        return True

    def _allocate_next(
        self, key: tuple[int, int, int], di: int, in_subrequest: bool, start: tuple[int, int]
    ) -> _Frame:
        """allocationMode ExactCount: device `di` is any free matching device from `start` (pool,
        device) on, each tried with the rest of the search after it."""
        ci, ri, si = key
        data = self.request_data[key]
        request = data.request
        first_pool, first_device = start
        for pool_index in range(first_pool, len(self.pools)):
            pool = self.pools[pool_index]
            if pool.incomplete or pool.invalid:
                continue
            offset = first_device if pool_index == first_pool else 0
            matching = self.matches.setdefault(key, {})
            preallocated, allocating = self.preallocated, self.allocating
            for device_index, device in enumerate(pool.device_list[offset:], start=offset):
                device_id = device.id
                if request.admin_access:
                    if ci in allocating.get(device_id, ()):
                        continue
                elif device_id in preallocated or allocating.get(device_id):
                    continue
                selectable = matching.get(device_id)
                if selectable is None:
                    selectable = self.selectable(device, key, data)
                if not selectable or self.capacity_left(device, request) is None:
                    continue
                undo = self.allocate_device(ci, key, pool, device, must=False)
                if undo is None:
                    continue
                # The next device of this request is searched after this one: combinations, not
                # permutations.
                outcome = yield (ci, ri, si, di + 1, in_subrequest, (pool_index, device_index + 1))
                if outcome is True:
                    return True
                undo()
                if outcome is _EXCEEDED:
                    return _EXCEEDED
        return False

    def allocate_device(
        self, ci: int, key: tuple[int, int, int], pool: _Pool, device: Device, *, must: bool
    ) -> Any:
        """allocateDevice: returns an undo function, or None when the device cannot be taken."""
        data = self.request_data[key]
        request = data.request
        shares = device.body.get("allowMultipleAllocations") is True
        if request.admin_access:
            if not shares and ci in self.allocating.get(device.id, ()):
                return None
        elif self.in_use(device.id):
            return None
        counters = bool(device.body.get("consumesCounters"))
        # A shared device already in use has its counters taken by its first allocation.
        if shares and (device.id in self.shared_use or device.id in self.allocating_capacity):
            counters = False
        if counters and not self._take_counters(pool, device):
            return None
        base, sub = (data.parent.name, request.name) if data.parent else (request.name, "")
        # From here on a rejected device keeps the counters it took for the rest of the search:
        # the 1.36 allocator (allocator_incubating.go, allocateDevice) returns without giving
        # them back when a taint or a constraint rejects the device, and we give its verdicts.
        if _taint_blocks(device, request):
            return None
        added: list[_MatchState] = []
        for constraint in self.constraints[ci]:
            if not constraint.add(base, sub, device):
                if must:
                    raise AllocationError(
                        f"claim {self.claims[ci].ref}, request {request.name}: cannot add device {device.id} "
                        "because a claim constraint would not be satisfied"
                    )
                for previous in added:
                    previous.remove(base, sub)
                return None
            added.append(constraint)
        allocating = self.allocating.setdefault(device.id, set())
        if not shares:
            allocating.add(ci)
        # Checked again as allocateDevice does; a shortfall here (only an `All` request's device
        # can have one) keeps what was taken above, as there.
        consumed = self.capacity_left(device, request)
        if consumed is None:
            return None
        share_id: str | None = None
        used: tuple[tuple[str, str], ...] = ()
        if shares:
            add_to(self.allocating_capacity.setdefault(device.id, {}), _values(consumed))
            used = tuple((name, str(amount)) for name, amount in consumed.items())
            share_id = str(
                uuid.uuid5(_SHARE_NAMESPACE, f"{self.claims[ci].ref}/{len(self.results[ci])}/{device.id}")
            )
        self.results[ci].append(
            AllocatedDevice(
                data.name,
                device.driver,
                device.pool,
                device.name,
                request.admin_access,
                share_id=share_id,
                consumed_capacity=used,
            )
        )
        count = len(self.results[ci])

        def undo() -> None:
            for constraint in self.constraints[ci]:
                constraint.remove(base, sub)
            allocating.discard(ci)
            if shares:
                # Counters a shared device took stay taken for the rest of the search, as in
                # the 1.36 allocator's rollback.
                totals = self.allocating_capacity[device.id]
                add_to(totals, _values(consumed), -1)
                if not any(totals.values()):
                    del self.allocating_capacity[device.id]
            elif counters:
                self._release_counters(pool, device)
            del self.results[ci][count - 1 :]

        return undo

    def capacity_left(self, device: Device, request: DeviceRequest) -> dict[str, Amount] | None:
        """CmpRequestOverCapacity: what the request would consume of the device's capacities,
        or None when it names one the device lacks, breaks a request policy or does not fit what
        allocated claims and this search already use."""
        key = (device.id, request.capacity)
        found = self._consumptions_of.get(key)
        if found is None:
            capacities = self.capacities(device)
            amounts = {
                name: _amount(text, f"claim request {request.name}: capacity {name}")
                for name, text in request.capacity
            }
            consumed = consumption(amounts, capacities)
            # Whether it fits an unused device: the answer for every device nobody shares yet.
            found = (consumed, consumed is not None and fits(consumed, capacities))
            self._consumptions_of[key] = found
        consumed, fits_unused = found
        if consumed is None:
            return None
        shared, allocating = self.shared_use.get(device.id), self.allocating_capacity.get(device.id)
        if not shared and not allocating:
            return consumed if fits_unused else None
        return consumed if fits(consumed, self.capacities(device), shared or {}, allocating or {}) else None

    def capacities(self, device: Device) -> dict[str, Capacity]:
        found = self._capacities.get(device.id)
        if found is None:
            try:
                found = device_capacities(device.body, f"device {device.id}")
            except CapacityError as err:
                raise AllocationError(str(err)) from None
            self._capacities[device.id] = found
        return found

    def _consumption(self, device: Device) -> list[tuple[tuple[str, str], int | Fraction]]:
        """What a device consumes, parsed once per simulation."""
        found = self._consumptions.get(device.id)
        if found is None:
            found = []
            for entry in device.body.get("consumesCounters") or []:
                if not isinstance(entry, Mapping):
                    continue
                set_name = str(entry.get("counterSet", ""))
                for counter, value in (entry.get("counters") or {}).items():
                    found.append(((set_name, counter), _number(Quantity.parse(str(_counter_value(value))))))
            self._consumptions[device.id] = found
        return found

    def _available(self, pool: _Pool) -> dict[tuple[str, str], int | Fraction]:
        """checkAvailableCounters: the pool's counters less what allocated devices consume
        (devices of earlier claims; admin-access results are not allocated devices)."""
        found = self._left.get(pool.id)
        if found is None:
            found = dict(pool.available)
            for device in pool.device_list:
                if device.id in self.preallocated or device.id in self.shared:
                    for key, amount in self._consumption(device):
                        if key in found:
                            found[key] -= amount
            self._left[pool.id] = found
        return found

    def _take_counters(self, pool: _Pool, device: Device) -> bool:
        """checkAvailableCounters: add the device's consumption, then compare every counter of the
        pool with what is consumed so far (not only the device's own: counters a rejected device
        kept count too), undoing it on a shortfall."""
        consumed = self.consumed.setdefault(pool.id, {})
        available = self._available(pool)
        wanted = self._consumption(device)
        for key, amount in wanted:
            consumed[key] = consumed.get(key, 0) + amount
        if any(consumed.get(key, 0) > total for key, total in available.items()):
            for key, amount in wanted:
                consumed[key] -= amount
            return False
        return True

    def _release_counters(self, pool: _Pool, device: Device) -> None:
        consumed = self.consumed[pool.id]
        for key, amount in self._consumption(device):
            consumed[key] -= amount


def _amount(text: str, where: str) -> Amount:
    try:
        return parse_amount(text, where)
    except CapacityError as err:
        raise AllocationError(str(err)) from None


def _values(amounts: Mapping[str, Amount]) -> Iterable[tuple[str, Fraction]]:
    return ((name, amount.value) for name, amount in amounts.items())


def _taint_blocks(device: Device, request: DeviceRequest) -> bool:
    for taint in device.body.get("taints") or []:
        if not isinstance(taint, Mapping) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(t.tolerates(taint) for t in request.tolerations):
            return True
    return False


class _Outcomes:
    """Selector outcomes per (expression, device), computed once: many claims share selectors."""

    def __init__(self, cel_devices: dict[str, CELDevice], *, list_type_attributes: bool = False) -> None:
        self.cel_devices = cel_devices
        self.list_type_attributes = list_type_attributes
        self._memo: dict[tuple[str, str], tuple[str, str, bool]] = {}
        self._verdicts: dict[
            tuple[str, int, tuple[str, ...]],
            tuple[list[SelectorOutcome], bool, tuple[str | None, str] | None],
        ] = {}

    def verdict(
        self, device: Device, device_class: DeviceClass | None, request: DeviceRequest
    ) -> tuple[list[SelectorOutcome], bool, tuple[str | None, str] | None]:
        """One device against a class and a request's selectors, lazily as the scheduler does:
        the outcomes (shared by every claim asking the same), whether all matched, and the error
        (owner None: the claim's own selector)."""
        # Classes live as long as the simulation: their identity is a key (their config is not hashable).
        key = (device.id, id(device_class), request.selectors)
        found = self._verdicts.get(key)
        if found is not None:
            return found
        outcomes: list[SelectorOutcome] = []
        matches = True
        error: tuple[str | None, str] | None = None
        groups: list[tuple[str, Sequence[str], str | None]] = []
        if device_class is not None:
            groups.append(
                (f"class {device_class.name}", device_class.selectors, f"class {device_class.name}")
            )
        groups.append(("request", request.selectors, None))
        for source, selectors, owner in groups:
            for i, expression in enumerate(selectors):
                if not matches or error:
                    outcomes.append(SelectorOutcome(source, i, expression, "skipped"))
                    continue
                outcome, message, compile_error = self.of(expression, device)
                outcomes.append(SelectorOutcome(source, i, expression, outcome, message))
                if outcome == "error":
                    kind = "CEL compile error" if compile_error else "CEL runtime error"
                    error = (owner, f"selector #{i}: {kind}: {message}")
                elif outcome == "false":
                    matches = False
        found = (outcomes, matches, error)
        self._verdicts[key] = found
        return found

    def of(self, expression: str, device: Device) -> tuple[str, str, bool]:
        key = (expression, device.id)
        found = self._memo.get(key)
        if found is None:
            found = evaluate_selector(
                expression, self.cel_devices[device.id], device.driver, self.list_type_attributes
            )
            self._memo[key] = found
        return found


def evaluate_selector(
    expression: str, device: CELDevice, driver: str, list_type_attributes: bool = False
) -> tuple[str, str, bool]:
    """("true"|"false"|"error", message, is_compile_error) for one selector on one device."""
    try:
        selector = compile_selector(expression, list_type_attributes=list_type_attributes)
        matched = selector.matches(device, driver)
    except CELCompileError as err:
        return "error", err.message, True
    except CELRuntimeError as err:
        return "error", err.message, False
    return ("true" if matched else "false"), "", False


# -- the public entry point --------------------------------------------------------------------------


def candidate_nodes(slices: Sequence[Slice]) -> list[str | None]:
    """Nodes that have node-local slices, sorted; [None] when every pool serves all nodes."""
    nodes = sorted({s.node_name for s in slices if s.node_name})
    return list(nodes) if nodes else [None]


def simulate(
    claims: Sequence[Claim],
    classes: Mapping[str, DeviceClass],
    slices: Sequence[Slice],
    node: str | None = None,
    in_use: Sequence[Claim] = (),
    *,
    list_type_attributes: bool = False,
    timeout: float | None = None,
) -> Simulation:
    """Allocate `claims` against the inventory on `node`, or on each candidate node in turn.

    `in_use`: other claims already allocated (a cluster's): their devices are taken, not reported.
    `list_type_attributes`: the DRAListTypeAttributes gate, which only changes CEL (as in 1.36,
    whose scheduler never passes it to the allocator's own features).
    `timeout`: seconds per node after which the search stops with the scheduler's timeout error
    (None: search to the end, however long the exhaustive search takes).
    """
    nodes = [node] if node is not None else candidate_nodes(slices)
    return Simulation(
        [
            simulate_node(
                claims, classes, slices, n, in_use, list_type_attributes=list_type_attributes, timeout=timeout
            )
            for n in nodes
        ]
    )


def simulate_node(
    claims: Sequence[Claim],
    classes: Mapping[str, DeviceClass],
    slices: Sequence[Slice],
    node: str | None,
    in_use: Sequence[Claim] = (),
    *,
    list_type_attributes: bool = False,
    timeout: float | None = None,
) -> NodeReport:
    deadline = None if timeout is None else time.monotonic() + timeout
    pools, warnings = gather_pools(slices, node)
    cel_devices = {
        d.id: to_cel_device(d.body, d.driver, list_type_attributes=list_type_attributes)
        for pool in pools
        for d in pool.devices()
    }
    outcomes = _Outcomes(cel_devices, list_type_attributes=list_type_attributes)
    inventory = _Inventory(classes, pools, set(), outcomes, node, deadline)
    pending: list[Claim] = []
    reports: dict[int, ClaimReport] = {}
    for claim in in_use:
        _hold(claim.allocated or (), inventory)
    for index, claim in enumerate(claims):
        if claim.allocated is not None:
            reports[index] = ClaimReport(claim, list(claim.allocated), preallocated=True)
            _hold(claim.allocated, inventory)
        else:
            pending.append(claim)
    allocator = _Allocator(pending, inventory)
    error: str | None = None
    satisfiable = False
    try:
        allocator.prepare()
        satisfiable = allocator.allocate()
    except AllocationError as err:
        error = str(err)
    pending_reports = [ClaimReport(claim) for claim in pending]
    if satisfiable:
        for report, results in zip(pending_reports, allocator.results, strict=True):
            report.results = list(results)
    for position, report in enumerate(pending_reports):
        report.requests = _explain_requests(allocator, position, pools, outcomes)
    reason = None
    if not satisfiable and error is None:
        reason = _diagnose(pending, inventory, pending_reports)
    ordered = []
    pending_iter = iter(pending_reports)
    for index in range(len(claims)):
        ordered.append(reports[index] if index in reports else next(pending_iter))
    return NodeReport(node, satisfiable and error is None, ordered, error, reason, warnings)


def _hold(results: Iterable[AllocatedDevice], inventory: _Inventory) -> None:
    """GatherAllocatedState: a shared result (with a share ID) adds what it consumes to the
    device's use; any other result, unless admin access, takes the device."""
    for result in results:
        device_id = f"{result.driver}/{result.pool}/{result.device}"
        if result.share_id is not None:
            inventory.shared.add(device_id)
            if result.consumed_capacity:
                amounts = (
                    (name, _amount(text, f"allocated device {device_id}: consumedCapacity {name}").value)
                    for name, text in result.consumed_capacity
                )
                add_to(inventory.shared_use.setdefault(device_id, {}), amounts)
        elif not result.admin_access:
            inventory.preallocated.add(device_id)


def _explain_requests(
    allocator: _Allocator, ci: int, pools: list[_Pool], outcomes: _Outcomes
) -> list[RequestReport]:
    """Every device against every request of claim `ci`, for the report (not lazily)."""
    claim = allocator.claims[ci]
    reports: list[RequestReport] = []
    for ri, request in enumerate(claim.requests):
        subs = list(request.first_available) if request.first_available else [request.exactly]
        for si, sub in enumerate(subs):
            assert sub is not None
            device_class = allocator.classes.get(sub.device_class)
            name = f"{request.name}/{sub.name}" if request.first_available else request.name
            report = RequestReport(name, sub.device_class, sub.mode, sub.count, sub.admin_access)
            data = allocator.request_data.get((ci, ri, 0))
            report.selected = not request.first_available or (data is not None and data.selected_sub == si)
            for pool in pools:
                for device in pool.devices():
                    report.devices.append(_verdict(device, device_class, sub, claim, outcomes))
            reports.append(report)
    return reports


def _verdict(
    device: Device,
    device_class: DeviceClass | None,
    request: DeviceRequest,
    claim: Claim,
    evaluated: _Outcomes,
) -> DeviceVerdict:
    outcomes, matches, error = evaluated.verdict(device, device_class, request)
    if error is not None and error[0] is None:
        text: str | None = f"claim {claim.ref}: {error[1]}"
    else:
        text = None if error is None else f"{error[0]}: {error[1]}"
    if device_class is None:
        text = text or f"device class {request.device_class} not found"
    return DeviceVerdict(device.id, outcomes, matches and text is None, text)


def _diagnose(claims: Sequence[Claim], inventory: _Inventory, reports: list[ClaimReport]) -> str:
    """Name the first claim that cannot be added, and why."""
    for count in range(1, len(claims) + 1):
        try:
            if _allocates(claims[:count], inventory):
                continue
            culprit = claims[count - 1]
            report = reports[count - 1]
            fits_alone = count > 1 and _allocates([culprit], inventory)
        except AllocationTimeoutError:
            return "no allocation satisfies all claims (naming the first that fails ran past the time limit)"
        except AllocationError as err:
            return str(err)
        if fits_alone:
            earlier = ", ".join(c.ref for c in claims[: count - 1])
            report.reason = (
                f"claim {culprit.ref} fits on its own, but not together with {earlier}: devices cannot be "
                "shared between claims"
            )
            return report.reason
        report.reason = _claim_reason(culprit, report, inventory)
        invalid = "; ".join(f"pool {p.id}: {p.invalid}" for p in inventory.pools if p.invalid)
        if invalid:
            # The scheduler's own words when a claim fails with invalid pools around.
            report.reason = f"invalid resource pools were encountered ({invalid}); {report.reason}"
        return f"claim {culprit.ref}: {report.reason}"
    return "no allocation satisfies all claims"  # pragma: no cover - the full search failed above


def _allocates(claims: Sequence[Claim], inventory: _Inventory) -> bool:
    trial = _Allocator(claims, inventory)
    trial.prepare()
    return trial.allocate()


def _claim_reason(claim: Claim, report: ClaimReport, inventory: _Inventory) -> str:
    preallocated = inventory.preallocated
    by_name: dict[str, list[RequestReport]] = {}
    for request_report in report.requests:
        by_name.setdefault(request_report.request.split("/")[0], []).append(request_report)
    problems: list[str] = []
    for request in claim.requests:
        options = by_name.get(request.name, [])
        short = [r for r in options if not _enough(r, preallocated)]
        if len(short) == len(options):
            problems.append("; ".join(_shortage(r, preallocated) for r in short))
    if problems:
        return "; ".join(problems)
    if lacking := _capacity_short(claim, report, inventory):
        return (
            f"request {lacking} has enough matching devices, but their capacity cannot serve the amounts it "
            "asks for (capacity.requests): a name the device does not publish, an amount outside its "
            "requestPolicy, or more than is left after the allocations that share it"
        )
    if _counters_bind(report, inventory):
        return (
            "every request has enough matching devices, but not enough of them fit the shared counters "
            "that are left (devices consuming counters, like MIG placements, exclude the ones they "
            "overlap and are excluded by allocated or existing ones)"
        )
    if claim.constraints:
        names = ", ".join(
            f"{'distinctAttribute' if c.distinct else 'matchAttribute'} {c.attribute}"
            for c in claim.constraints
        )
        return (
            f"every request has enough matching devices, but no combination satisfies the constraints "
            f"({names}) and the requests together"
        )
    return "every request has enough matching devices, but not enough distinct ones for all requests together"


def _capacity_short(claim: Claim, report: ClaimReport, inventory: _Inventory) -> str | None:
    """The first request none of whose options (the request, or each subrequest) has enough
    matching free devices that can give the capacity it asks for."""
    trial = _Allocator([], inventory)
    devices = {d.id: d for pool in inventory.pools for d in pool.devices()}
    reports = {r.request: r for r in report.requests}

    def short(name: str, request: DeviceRequest) -> bool:
        serving = sum(
            1
            for verdict in reports[name].devices
            if verdict.matches
            and verdict.device not in inventory.preallocated
            and trial.capacity_left(devices[verdict.device], request) is not None
        )
        return serving < (1 if request.mode == ALL else request.count)

    for request in claim.requests:
        if request.exactly is not None:
            options = [(request.name, request.exactly)]
        else:
            options = [(f"{request.name}/{sub.name}", sub) for sub in request.first_available]
        if all(short(name, sub) for name, sub in options):
            return request.name
    return None


def _counters_bind(report: ClaimReport, inventory: _Inventory) -> bool:
    """Whether some matching free device of the claim cannot be taken for lack of shared counters."""
    trial = _Allocator([], inventory)
    devices = {d.id: (pool, d) for pool in inventory.pools for d in pool.devices()}
    for request in report.requests:
        for verdict in request.devices:
            pool, device = devices[verdict.device]
            consumption = device.body.get("consumesCounters") or []
            if verdict.matches and verdict.device not in inventory.preallocated and consumption:
                if not trial._take_counters(pool, device):
                    return True
                trial._release_counters(pool, device)
    return False


def _free_matching(report: RequestReport, preallocated: set[str]) -> int:
    return sum(
        1 for d in report.devices if d.matches and (report.admin_access or d.device not in preallocated)
    )


def _enough(report: RequestReport, preallocated: set[str]) -> bool:
    free = _free_matching(report, preallocated)
    return free >= 1 if report.mode == ALL else free >= report.count


def _shortage(report: RequestReport, preallocated: set[str]) -> str:
    total = len(report.devices)
    matching = report.matching
    free = _free_matching(report, preallocated)
    if report.mode == ALL:
        return f"request {report.request} asks for all matching devices, but none of {total} matches"
    held = f" ({matching - free} of them already allocated)" if free < matching else ""
    return (
        f"request {report.request} needs {report.count} device(s) of class {report.device_class}, "
        f"{matching} of {total} match its selectors{held}"
    )
