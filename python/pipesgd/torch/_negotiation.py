"""Peers agree before bytes move: the collectives of pipesgd.torch are negotiated, as Horovod's
coordinator does, before any of them runs.

Every collective is submitted under a name (the caller's ``name=``, else "noname.<n>" with a counter
of the unnamed ones, so unnamed collectives match by the order each rank issued them) with a
descriptor: its kind, reduction op, dtype, shape (allgather: after dimension 0), root and scale
factors. A rank that must wait for a collective (a blocking call, ``synchronize``, ``poll``) runs
negotiation rounds: one allgather per round, in which every rank sends a header and a row per
pending collective (up to ``_CAPACITY`` of them; 16 int64 words, 128 bytes, each). From the gathered
rows, which every rank reads identically, each round

- runs the collectives every rank has submitted, in rank 0's order, after checking that their
  descriptors agree; a disagreement fails that collective on every rank with Horovod's wording
  (a RuntimeError), and nothing of it is sent;
- when nothing could run and every rank has listed, for longer than the stall limit, a collective
  that not every rank listed (a "count" mismatch: they all wait on what no peer will submit),
  fails every such collective on the ranks that listed it; an unnamed one gives its number back
  (when it was the rank's latest), so that the ranks' unnamed collectives are in step again.

Phases: init() called again on an initialized world (as each test of a test suite does) begins a
new phase on that rank: names are matched within a phase, the unnamed counter restarts, and a
collective of an earlier phase that not every rank listed fails at once as soon as some rank has
begun a later phase (that rank went on and will never submit it), so one test's leftovers never
pair with, or hold up, the next test's collectives.

A name submitted twice before the first completed is a ValueError on that rank, at once (Horovod's).
Not thread-safe: the thread that called init() issues the collectives.
"""
import time
import zlib

import torch

_MAGIC = 0x70736764  # "psgd"
_CAPACITY = 32       # collectives per round and rank
_WORDS = 16          # int64 words per collective (and of the header)
_SHAPE_WORDS = 6     # dimensions sent as they are; the rest enter `extra`

KINDS = ["allreduce", "allgather", "broadcast", "barrier", "broadcast_object", "allgather_object", "object"]
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
           torch.int32, torch.int64, torch.bool]
_DTYPE_NAMES = {d: str(d).replace("torch.", "") for d in _DTYPES}


def _hash64(text):
    data = text.encode()
    return (zlib.crc32(data) << 31) ^ zlib.adler32(data) ^ len(data)


class Descriptor:
    """What every rank must agree on for one collective."""

    def __init__(self, kind, tensor=None, op=-1, root=-1, scales=(1.0, 1.0)):
        self.kind = KINDS.index(kind)
        self.op = op
        self.root = root
        if tensor is not None:
            self.dtype = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else len(_DTYPES)
            shape = list(tensor.shape)
            if kind == "allgather":
                shape = shape[1:] if shape else []  # dimension 0 may differ
                self.ndim = tensor.dim()
            else:
                self.ndim = len(shape)
        else:
            self.dtype, shape, self.ndim = -1, [], -1
        self.shape = shape
        self.extra = _hash64(repr((shape[_SHAPE_WORDS:], float(scales[0]), float(scales[1]))))

    def words(self, name_hash, age_ms):
        dims = (list(self.shape[:_SHAPE_WORDS]) + [-1] * _SHAPE_WORDS)[:_SHAPE_WORDS]
        row = [name_hash, self.kind, self.op, self.dtype, self.root, self.ndim] + dims + [self.extra, age_ms, 0, 0]
        # words 13 (age) and 14 (phase) are the lister's, not compared
        assert len(row) == _WORDS
        return row


def _shape_text(row, kind):
    ndim = int(row[5])
    dims = [int(d) for d in row[6:6 + _SHAPE_WORDS] if d >= 0]
    if kind == "allgather":
        return f"[?, {', '.join(map(str, dims))}]" if ndim > 1 else "[?]"
    return "[" + ", ".join(map(str, dims)) + ("" if ndim <= _SHAPE_WORDS else ", ...") + "]"


def _dtype_text(code):
    return _DTYPE_NAMES[_DTYPES[code]] if 0 <= code < len(_DTYPES) else "unknown"


def mismatch_message(rows, op_names):
    """Horovod's wording for the first difference between the ranks' descriptors (rows of words),
    or None if they agree."""
    first = rows[0]
    kind = KINDS[int(first[1])]
    for row in rows[1:]:
        if row[1] != first[1]:
            a, b = KINDS[int(first[1])], KINDS[int(row[1])]
            return f"Mismatched operations: One rank did an {a}, but another rank did an {b}."
        if row[3] != first[3]:
            return (f"Mismatched data types: One rank had type {_dtype_text(int(first[3]))}, but another rank had "
                    f"type {_dtype_text(int(row[3]))}.")
        if row[2] != first[2]:
            return (f"Mismatched {kind} reduction operations: One rank specified {op_names.get(int(first[2]), first[2])}, "
                    f"but another rank specified {op_names.get(int(row[2]), row[2])}.")
        if row[4] != first[4]:
            return (f"Mismatched {kind} root ranks: One rank specified root rank {int(first[4])}, but another rank "
                    f"specified root rank {int(row[4])}.")
        if row[5] != first[5]:
            return (f"Mismatched {kind} tensor shapes: One rank sent a tensor of rank {int(first[5])}, but another "
                    f"rank sent a tensor of rank {int(row[5])}.")
        if list(row[6:6 + _SHAPE_WORDS]) != list(first[6:6 + _SHAPE_WORDS]) or row[12] != first[12]:
            if kind == "allreduce" or kind == "broadcast" or kind == "allgather":
                return (f"Mismatched {kind} tensor shapes: One rank sent a tensor of shape {_shape_text(first, kind)}, "
                        f"but another rank sent a tensor of shape {_shape_text(row, kind)}.")
            return f"Mismatched {kind} arguments (shape or scale factors differ between ranks)."
    return None


class _Pending:
    __slots__ = ("handle", "name", "name_hash", "descriptor", "run", "submitted", "phase", "unnamed")

    def __init__(self, handle, name, descriptor, run, phase, unnamed):
        self.handle, self.name, self.descriptor, self.run, self.phase = handle, name, descriptor, run, phase
        self.unnamed = unnamed  # its number among the phase's unnamed collectives, or None
        self.name_hash = _hash64(f"{phase}:{name}")
        self.submitted = time.monotonic()


class Negotiator:
    """The pending collectives of this process and the rounds that run them (see the module's doc)."""

    def __init__(self, worker, stall_seconds, op_names):
        self._worker = worker
        self._stall_seconds = stall_seconds
        self._op_names = op_names
        self._pending = []             # _Pending in submission order
        self._names = set()
        self._results = {}             # handle -> result, or ("error", exception)
        self._next_handle = 0
        self._unnamed = 0  # unnamed collectives submitted in this phase
        self._phase = 0
        self._quiesced = 0  # quiesce() calls

    def new_phase(self):
        """init() again: what follows is a new phase of the program (see the module's doc)."""
        self._phase += 1
        self._unnamed = 0

    def submit(self, kind, name, descriptor, run):
        """Queues a collective; returns its handle. ValueError for a name already pending."""
        unnamed = None
        if name is None:
            unnamed = self._unnamed
            name = f"noname.{unnamed}"
            self._unnamed += 1
        name = str(name)
        if name in self._names:
            raise ValueError(f"Requested to {kind} a tensor with the same name as another tensor that is currently "
                             f"being processed. If you want to request another tensor, use a different tensor "
                             f"name. (name '{name}')")
        handle = self._next_handle
        self._next_handle += 1
        self._pending.append(_Pending(handle, name, descriptor, run, self._phase, unnamed))
        self._names.add(name)
        return handle

    def known(self, handle):
        return handle in self._results or any(p.handle == handle for p in self._pending)

    def done(self, handle):
        return handle in self._results

    def wait(self, handle):
        """Runs rounds until `handle` completed; returns its result or raises its error."""
        idle = 0.0
        while handle not in self._results:
            if self.round():
                idle = 0.0
            else:
                idle = min(0.01, idle * 2 + 0.0005)
                time.sleep(idle)
        return self.take(handle)

    def take(self, handle):
        result = self._results.pop(handle)
        if isinstance(result, tuple) and len(result) == 2 and result[0] is _ERROR:
            raise result[1]
        return result

    def quiesce(self, what):
        """A barrier negotiated like any collective (named "pipesgd.WHAT.N", N counting this rank's
        calls): every rank leaves its rounds in the same round, so that collectives outside the
        negotiation (the C++ optimizer's) may follow. What is still pending stays pending."""
        self._quiesced += 1
        self.wait(self.submit("barrier", f"pipesgd.{what}.{self._quiesced}", Descriptor("barrier"), lambda: None))

    def round(self):
        """One negotiation round (a collective: every rank's round pairs with one of every other
        rank's). Returns True if a collective completed or failed."""
        worker = self._worker
        listed = self._pending[:_CAPACITY]
        header = [_MAGIC, len(listed), self._phase] + [0] * (_WORDS - 3)
        rows = [header]
        now = time.monotonic()
        for entry in listed:
            row = entry.descriptor.words(entry.name_hash, int((now - entry.submitted) * 1000))
            row[14] = entry.phase
            rows.append(row)
        # Each rank's header and its rows, concatenated in rank order (the row counts differ).
        flat = worker.allgather(torch.tensor(rows, dtype=torch.int64)).tolist()
        gathered, at = [], 0
        while at < len(flat):
            if flat[at][0] != _MAGIC:
                raise RuntimeError("pipesgd.torch: a negotiation round paired with another collective "
                                   "(a collective outside the negotiation on some rank)")
            count = int(flat[at][1])
            gathered.append(flat[at:at + 1 + count])
            at += 1 + count
        size = len(gathered)
        lists = []
        for r in range(size):
            count = int(gathered[r][0][1])
            lists.append({int(row[0]): row for row in gathered[r][1:1 + count]})
        mine = {entry.name_hash: entry for entry in listed}
        progressed = False
        # Rank 0's order: what every rank listed runs (or fails on every rank).
        for row0 in gathered[0][1:1 + int(gathered[0][0][1])]:
            name_hash = int(row0[0])
            if not all(name_hash in lists[r] for r in range(size)):
                continue
            entry = mine[name_hash]
            message = mismatch_message([lists[r][name_hash] for r in range(size)], self._op_names)
            self._remove(entry)
            progressed = True
            if message is not None:
                self._results[entry.handle] = (_ERROR, RuntimeError(f"{message} (collective '{entry.name}')"))
                continue
            try:
                self._results[entry.handle] = entry.run()
            except Exception as error:  # a peer's failure, a timeout: the world is broken
                self._results[entry.handle] = (_ERROR, error)
                raise
        if progressed:
            return True
        # Nothing could run: what a rank lists while some peer does not fails there if it is of an
        # earlier phase than a peer's, or, once every rank has listed such a collective for longer
        # than the stall limit (they all wait on what no peer will submit), all of it (every rank
        # computes the same set from the table). A failed unnamed collective of this phase gives its
        # number back if no later one took the next (its peers never counted it).
        everywhere = set.intersection(*(set(l) for l in lists))
        limit_ms = self._stall_seconds * 1000
        latest_phase = max(int(gathered[r][0][2]) for r in range(size))
        deadlocked = all(any(h not in everywhere and row[13] > limit_ms for h, row in lists[r].items())
                         for r in range(size))
        stale = [(r, h) for r in range(size) for h, row in lists[r].items()
                 if h not in everywhere and (deadlocked or row[14] < latest_phase)]
        if not stale:
            return False
        given_back = set()
        for r, name_hash in stale:
            if r != self._worker.rank:
                continue
            entry = mine[name_hash]
            if entry.unnamed is not None and entry.phase == self._phase:
                given_back.add(entry.unnamed)
            missing = [q for q in range(size) if name_hash not in lists[q]]
            self._remove(entry)
            self._results[entry.handle] = (_ERROR, RuntimeError(
                f"Mismatched collectives: '{entry.name}' ({KINDS[entry.descriptor.kind]}) was not submitted by "
                f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
                + (f" before {'it' if len(missing) == 1 else 'they'} called init() again (a new phase)"
                   if entry.phase < latest_phase else f" within {self._stall_seconds:g} s")
                + " (the ranks issued different collectives)"))
        while self._unnamed - 1 in given_back:
            self._unnamed -= 1
        return True

    def _remove(self, entry):
        self._pending.remove(entry)
        self._names.discard(entry.name)


_ERROR = object()
