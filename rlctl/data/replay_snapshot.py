"""The replay snapshot format: a prioritized replay buffer's contents as plain arrays in an uncompressed .npz.

`ReplaySnapshot` is what a snapshot holds, as typed values. `to_arrays` lays it out for the file; `from_arrays` is
the one parser of what a file held: hostile input (a snapshot on a shared disk, a crafted file), so every array is
checked (names, dtypes, shapes, counters, FIFO invariants, finiteness, the memory a rebuild needs) before anything
is allocated from it. `save_snapshot` writes atomically and durably; `read_snapshot_arrays` reads with pickling
disabled. rlctl.data.buffers rebuilds a PrioritizedReplay from the parsed value.
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlctl.durable import replace_file

__all__ = ["SnapshotError", "ReplaySnapshot", "save_snapshot", "read_snapshot_arrays", "DEFAULT_MAX_SNAPSHOT_BYTES"]


class SnapshotError(ValueError):
    """A replay snapshot that is unreadable, malformed or inconsistent (the message names what is wrong)."""


_SNAPSHOT_FORMAT = "rlctl.PrioritizedReplay"
_SNAPSHOT_VERSION = 1
_INT_SCALARS = ("capacity", "size", "inserted", "sampled_batches", "beta_steps", "next_slot")
_FLOAT_SCALARS = ("max_priority", "alpha", "beta", "eps")
# bool, ints, floats, complex, datetimes, fixed-size strings: never objects, structs or raw void bytes.
_FIELD_KINDS = frozenset("biufcmMSU")
_RNG_CLASSES = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_MAX_JSON_BYTES = 1 << 20  # layout / RNG state are tiny; a bigger blob is junk, not worth parsing
_MAX_FIELD_NDIM = 32  # numpy allows 64 dims in all, and a record field adds the slot axis
# Refuse snapshots whose rebuilt buffer would need more memory than this (a crafted capacity or
# field shape must not be able to OOM-kill the shard); raise it via `max_bytes` for bigger buffers.
DEFAULT_MAX_SNAPSHOT_BYTES = 1 << 36

Field = tuple[str, tuple[int, ...], np.dtype]  # name, per-item shape, dtype


@dataclass
class ReplaySnapshot:
    """A buffer's contents: its fields in buffer order, counters and settings, and the filled slots [0, size) of
    its keys, leaf priorities and field arrays (slots fill 0, 1, 2, ... and are then only overwritten, so the
    filled ones are exactly that prefix, and storing it keeps every slot position)."""

    fields: list[Field]
    capacity: int
    size: int
    inserted: int
    sampled_batches: int
    beta_steps: int
    max_priority: float
    alpha: float
    beta: float
    eps: float
    keys: np.ndarray  # int64 [size]
    priorities: np.ndarray  # float64 [size]: leaf values; inner sum-tree nodes are a pure function of them
    data: list[np.ndarray]  # per field, [size, *shape]
    rng: np.random.Generator

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Copies of everything, as plain (non-object) arrays named for the .npz."""
        layout = {
            "format": _SNAPSHOT_FORMAT,
            "version": _SNAPSHOT_VERSION,
            "fields": [{"name": name, "shape": list(shape), "dtype": _snapshot_dtype(name, dt)}
                       for name, shape, dt in self.fields],
        }
        out = {"layout": _json_array(layout), "rng_state": _json_array(self.rng.bit_generator.state)}
        out["keys"] = self.keys.copy()
        out["priorities"] = self.priorities.copy()
        # Numbered, not named: field names may hold any characters, zip member names should not.
        for i, a in enumerate(self.data):
            out[f"field_{i}"] = a.copy()
        next_slot = self.inserted % self.capacity  # where `add` puts the next transition
        ints = (self.capacity, self.size, self.inserted, self.sampled_batches, self.beta_steps, next_slot)
        for name, v in zip(_INT_SCALARS, ints):
            out[name] = np.array(v, dtype=np.int64)
        for name, v in zip(_FLOAT_SCALARS, (self.max_priority, self.alpha, self.beta, self.eps)):
            out[name] = np.array(v, dtype=np.float64)
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], capacity: int | None = None, *,
                    max_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES) -> ReplaySnapshot:
        """Parse `to_arrays` output (from a file: hostile), checking all of it; SnapshotError if anything is off.
        `capacity`, when given, must be the snapshot's; the rebuilt buffer may need at most `max_bytes`."""
        fields = _parse_layout(_json_value(arrays, "layout"))
        expected = {*_INT_SCALARS, *_FLOAT_SCALARS, "layout", "rng_state", "keys", "priorities"}
        expected.update(f"field_{i}" for i in range(len(fields)))
        unknown = set(arrays) - expected
        if unknown:
            raise SnapshotError(f"unexpected arrays {sorted(map(str, unknown))} (layout has {len(fields)} fields)")
        counters = _parse_counters(arrays, capacity)
        cap, size, inserted = counters["capacity"], counters["size"], counters["inserted"]
        _check_memory(fields, cap, max_bytes)
        keys = _parse_keys(arrays, cap, size, inserted)
        priorities = _parse_priorities(arrays, size)
        data = _parse_field_data(arrays, fields, size)
        rng = _rng_from_state(_json_value(arrays, "rng_state"))
        return cls(fields=fields, keys=keys, priorities=priorities, data=data, rng=rng, **counters)


def save_snapshot(replay, path: str | Path) -> Path:
    """Write `replay` (a PrioritizedReplay, or anything with its `snapshot_arrays`) to `path` as an uncompressed .npz, atomically and durably (the old file survives any failure)."""
    arrays = replay.snapshot_arrays()
    return replace_file(path, lambda f: np.savez(f, **arrays))


def read_snapshot_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a snapshot file, unchecked but for being an uncompressed .npz of non-pickled arrays;
    SnapshotError if unreadable, FileNotFoundError if absent."""
    try:
        with open(path, "rb") as f:
            # Only a zip can be an .npz; refusing anything else early also avoids reading a huge bare .npy.
            if f.read(4) != b"PK\x03\x04":
                raise SnapshotError("not an .npz (zip) file")
            f.seek(0)
            with np.load(f, allow_pickle=False) as z:
                # save_snapshot never compresses, and stored members cannot decompress into more than the file.
                packed = [i.filename for i in z.zip.infolist() if i.compress_type != zipfile.ZIP_STORED]
                if packed:
                    raise SnapshotError(f"compressed members {packed} (snapshots are written uncompressed)")
                return {name: z[name] for name in z.files}
    except FileNotFoundError:
        raise
    except SnapshotError as e:
        raise SnapshotError(f"{path}: {e}") from None
    # Hostile bytes can fail zipfile / numpy.lib.format in many ways (BadZipFile, EOFError, ValueError for
    # object arrays, MemoryError for absurd shapes, ...): all of them mean "bad snapshot".
    except Exception as e:
        raise SnapshotError(f"{path}: cannot read snapshot: {type(e).__name__}: {e}") from e


def _parse_counters(arrays: Mapping[str, np.ndarray], capacity: int | None) -> dict[str, int | float]:
    """The counters and settings, each checked alone and against `add`'s FIFO invariants."""
    cap, size, inserted, sampled, beta_steps, next_slot = (_scalar(arrays, n, np.int64) for n in _INT_SCALARS)
    max_p, alpha, beta, eps = (_scalar(arrays, n, np.float64) for n in _FLOAT_SCALARS)
    if cap < 1:
        raise SnapshotError(f"capacity must be >= 1, got {cap}")
    if capacity is not None and int(capacity) != cap:
        raise SnapshotError(f"snapshot capacity {cap} != requested capacity {int(capacity)}")
    if not 0 <= size <= cap:
        raise SnapshotError(f"size {size} outside [0, capacity={cap}]")
    if inserted < 0 or sampled < 0:
        raise SnapshotError(f"counters must be non-negative: inserted={inserted}, sampled_batches={sampled}")
    # FIFO invariants of `add`: the buffer fills up before wrapping; the next insert goes to inserted % capacity.
    if size != min(cap, inserted):
        raise SnapshotError(f"size {size} != min(capacity={cap}, inserted={inserted})")
    if next_slot != inserted % cap:
        raise SnapshotError(f"next_slot {next_slot} != inserted % capacity = {inserted % cap}")
    for name, v in zip(_FLOAT_SCALARS, (max_p, alpha, beta, eps)):
        if not math.isfinite(v):
            raise SnapshotError(f"{name} must be finite, got {v}")
    if alpha < 0 or eps < 0 or max_p < 0:
        raise SnapshotError(f"alpha, eps and max_priority must be >= 0, got {alpha}, {eps}, {max_p}")
    try:  # `add` computes this for every default-priority insert; an overflow would break all later adds
        default_leaf = (max_p + eps) ** alpha
    except OverflowError:
        default_leaf = math.inf
    if not math.isfinite(default_leaf):
        raise SnapshotError(f"(max_priority + eps) ** alpha overflows: {max_p}, {eps}, {alpha}")
    return {"capacity": cap, "size": size, "inserted": inserted, "sampled_batches": sampled,
            "beta_steps": beta_steps, "max_priority": max_p, "alpha": alpha, "beta": beta, "eps": eps}


def _check_memory(fields: list[Field], cap: int, max_bytes: int) -> None:
    """Refuse a buffer that would need more than `max_bytes`, before allocating any of it (Python ints: no
    overflow)."""
    record_bytes = sum(math.prod(shape) * dt.itemsize + dt.alignment for _, shape, dt in fields)
    leaves = 1 << max(0, (cap - 1).bit_length())
    need = cap * (record_bytes + 8) + 16 * leaves
    if need > max_bytes:
        raise SnapshotError(f"rebuilt buffer would need ~{need} bytes > max_bytes={max_bytes}")


def _parse_keys(arrays: Mapping[str, np.ndarray], cap: int, size: int, inserted: int) -> np.ndarray:
    """The filled slots' keys: exactly inserted-size .. inserted-1, key k in slot k % capacity."""
    keys = _array(arrays, "keys")
    if keys.dtype != np.int64 or keys.shape != (size,):
        raise SnapshotError(f"'keys' must be int64 of shape ({size},), got {keys.dtype} {keys.shape}")
    live = np.arange(inserted - size, inserted, dtype=np.int64)
    want = np.empty(size, dtype=np.int64)
    want[live % cap] = live
    bad = np.flatnonzero(keys != want)
    if bad.size:
        s = int(bad[0])
        raise SnapshotError(
            f"keys inconsistent with inserted={inserted}: slot {s} holds {keys[s]}, expected {want[s]}")
    return keys


def _parse_priorities(arrays: Mapping[str, np.ndarray], size: int) -> np.ndarray:
    """The filled slots' leaf priorities: float64, finite and >= 0 (their sum is checked once the tree is built)."""
    prio = _array(arrays, "priorities")
    if prio.dtype != np.float64 or prio.shape != (size,):
        raise SnapshotError(f"'priorities' must be float64 of shape ({size},), got {prio.dtype} {prio.shape}")
    bad = np.flatnonzero(~(np.isfinite(prio) & (prio >= 0.0)))
    if bad.size:
        s = int(bad[0])
        raise SnapshotError(f"priorities must be finite and >= 0: slot {s} has {prio[s]} ({bad.size} bad)")
    return prio


def _parse_field_data(arrays: Mapping[str, np.ndarray], fields: list[Field], size: int) -> list[np.ndarray]:
    """Each field's filled slots, of exactly the layout's dtype and shape."""
    data = []
    for i, (name, shape, dt) in enumerate(fields):
        a = _array(arrays, f"field_{i}")
        if a.dtype != dt or a.shape != (size, *shape):
            raise SnapshotError(
                f"'field_{i}' ({name!r}) is {a.dtype} {a.shape}, layout says {dt.str} {(size, *shape)}")
        data.append(a)
    return data


def _snapshot_dtype(name: str, dt: np.dtype) -> str:
    """`dt` as the dtype string a layout stores; SnapshotError for dtypes snapshots do not support."""
    if dt.kind not in _FIELD_KINDS or dt.fields is not None or dt.subdtype is not None or np.dtype(dt.str) != dt:
        raise SnapshotError(f"field {name!r}: dtype {dt} cannot be snapshotted (plain numeric/string dtypes only)")
    return dt.str


def _json_array(obj) -> np.ndarray:
    """`obj` as UTF-8 JSON bytes in a uint8 array (numpy arrays inside become lists)."""
    text = json.dumps(obj, separators=(",", ":"), default=lambda o: o.tolist())
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def _array(arrays: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """arrays[name], which must exist and be a non-object numpy array."""
    if name not in arrays:
        raise SnapshotError(f"missing array {name!r}")
    try:
        a = arrays[name]
    except Exception as e:  # a lazy mapping (an open NpzFile) reads here
        raise SnapshotError(f"cannot read array {name!r}: {type(e).__name__}: {e}") from e
    if not isinstance(a, np.ndarray):
        raise SnapshotError(f"{name!r} is a {type(a).__name__}, not a numpy array")
    if a.dtype.hasobject:
        raise SnapshotError(f"{name!r} has object dtype {a.dtype}")
    return a


def _scalar(arrays: Mapping[str, np.ndarray], name: str, dtype: type) -> int | float:
    """arrays[name] as a Python int/float; it must be a 0-d or 1-element array of exactly `dtype`."""
    a = _array(arrays, name)
    if a.dtype != dtype or a.shape not in ((), (1,)):
        raise SnapshotError(f"{name!r} must be a 0-d or 1-element {np.dtype(dtype)} array, got {a.dtype} {a.shape}")
    return a.reshape(()).item()


def _json_value(arrays: Mapping[str, np.ndarray], name: str):
    """Parse arrays[name], a 1-D uint8 array of UTF-8 JSON."""
    a = _array(arrays, name)
    if a.dtype != np.uint8 or a.ndim != 1:
        raise SnapshotError(f"{name!r} must be a 1-D uint8 array of JSON, got {a.dtype} {a.shape}")
    if a.size > _MAX_JSON_BYTES:
        raise SnapshotError(f"{name!r} is {a.size} bytes, more than {_MAX_JSON_BYTES}")
    try:
        return json.loads(a.tobytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SnapshotError(f"{name!r} is not valid UTF-8 JSON: {e}") from None


def _parse_layout(layout) -> list[Field]:
    """Validate a layout dict -> [(field name, shape, dtype)] in buffer order."""
    if not isinstance(layout, dict) or layout.get("format") != _SNAPSHOT_FORMAT:
        raise SnapshotError(f"layout: not a {_SNAPSHOT_FORMAT} snapshot")
    if layout.get("version") != _SNAPSHOT_VERSION:
        raise SnapshotError(f"layout: unsupported version {layout.get('version')!r} (expected {_SNAPSHOT_VERSION})")
    fields = layout.get("fields")
    if not isinstance(fields, list) or not fields:
        raise SnapshotError("layout: 'fields' must be a non-empty list")
    out, seen = [], set()
    for i, f in enumerate(fields):
        if not isinstance(f, dict) or set(f) != {"name", "shape", "dtype"}:
            raise SnapshotError(f"layout field {i}: expected an object with exactly name, shape and dtype")
        name, shape, dtype = f["name"], f["shape"], f["dtype"]
        if not isinstance(name, str) or not name or name in seen:
            raise SnapshotError(f"layout field {i}: name must be a unique non-empty string, got {name!r}")
        seen.add(name)
        # type() is int: rejects bools and floats, which isinstance(_, int) / int() would let through.
        if (not isinstance(shape, list) or len(shape) > _MAX_FIELD_NDIM
                or not all(type(d) is int and d >= 0 for d in shape)):
            raise SnapshotError(f"layout field {name!r}: shape must be a list of at most "
                                f"{_MAX_FIELD_NDIM} non-negative ints, got {shape!r}")
        out.append((name, tuple(shape), _layout_dtype(name, dtype)))
    return out


def _layout_dtype(name: str, s) -> np.dtype:
    """The dtype a layout names; only canonical strings of plain dtypes, as `_snapshot_dtype` writes them."""
    dt = None
    if isinstance(s, str) and len(s) <= 32:
        try:
            dt = np.dtype(s)
        except Exception:  # TypeError / ValueError / deprecation warnings-as-errors for junk strings
            dt = None
    if dt is None or dt.str != s or dt.kind not in _FIELD_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise SnapshotError(f"layout field {name!r}: unsupported dtype {s!r}")
    return dt


def _rng_from_state(state) -> np.random.Generator:
    """A Generator over one of numpy's own bit generators, restored to `state` (a bit_generator.state dict)."""
    kind = state.get("bit_generator") if isinstance(state, dict) else None
    if kind not in _RNG_CLASSES:
        raise SnapshotError(f"rng_state: unsupported bit generator {kind!r}")
    bit_generator = getattr(np.random, kind)()
    try:
        bit_generator.state = state
    except Exception as e:  # the setters raise TypeError / ValueError / KeyError / OverflowError on junk
        raise SnapshotError(f"rng_state: invalid {kind} state: {type(e).__name__}: {e}") from None
    return np.random.Generator(bit_generator)
