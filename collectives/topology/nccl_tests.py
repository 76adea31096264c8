"""Parse nccl-tests output exactly as it prints (all_reduce_perf, all_gather_perf, reduce_scatter_perf,
alltoall_perf, broadcast_perf, reduce_perf, sendrecv_perf, gather_perf, scatter_perf).

The format, from NVIDIA/nccl-tests (read at v2.19.6, commit a0b82b2, and its history):

- run header (src/util.cu ``writeDeviceReport``; src/common.cu before 2025-10):
  ``# nccl-tests version 2.17.6 nccl-headers=22803 nccl-library=22803`` (since 2025-10),
  ``# Collective test starting: all_reduce_perf`` (since 2025-06), ``# nThread 1 nGpus 1 minBytes 8 ...``,
  ``# Using devices`` then one line per rank, ``#  Rank  0 Group  0 Pid  1234 on  host device  0 [0000:18:00]
  NVIDIA H100 80GB HBM3`` (``#   Rank  0 Pid ... [0x18]`` before 2.13, ``#   Rank  0 on host ...`` in 2017);
- table header (``writeResultHeader``): a line naming the columns, ``#  size  count  type  redop  root  time
  algbw  busbw  #wrong  time  algbw  busbw  #wrong``, then their units ``#  (B)  (elements) ... (us) (GB/s)``.
  Before the resync with NCCL 2.13 (commit 51af557, 2022-08) each test printed its own leading columns
  (all_reduce: size count type redop; all_gather and sendrecv: size count type; broadcast: size count type
  root; reduce: size count type redop root) and the check column was ``error`` (max delta, ``%5.0le``); the
  2017-2019 versions named them ``bytes N type op ... res`` and printed the time in ms. Optional extras
  are read from the header too: per-iteration statistics (``-I 1``: i_min i_max i_p99 i_cv% after each
  #wrong), a side-bandwidth column, a timestamp;
- rows (``writeBenchmarkLinePreamble`` / ``writeBenchmarkLineBody``): ``%12li  %12li  %8s  %6s  %6s`` then per
  placement ``  %7s  %6s  %6s  %6g`` (time us, algbw, busbw, #wrong; ``N/A`` when not checked; numbers through
  ``getFloatStr``: 2 decimals, fewer as they grow, ``%.1e`` past the width). ``size`` is max(send, receive)
  bytes per rank, the nccl-tests message size of DESIGN.md §3; ``count`` is the parameter count, so for
  all_gather, reduce_scatter, alltoall, gather and scatter size = count x word size x ranks;
- footer: ``# Out of bounds values : 0 OK``, ``# Avg bus bandwidth    : 41.37`` (the mean of every busbw
  printed, out-of-place and in-place).

NCCL_DEBUG=INFO lines (``host:pid:tid [dev] NCCL INFO ...``) may be interleaved anywhere: they are skipped,
except ``NCCL version 2.18.5+cuda12.2`` and ``comm 0x... rank 0 nranks 16 ...`` which give the NCCL version
and the rank count. Output prefixed by ``srun --label`` (``3: ``) or ``mpirun --tag-output``
(``[1,0]<stdout>:``) is read too. Any other line is someone else's output and is skipped; a line that
starts like a table row and does not parse as one is a ``CollectiveError`` naming the line.

One text may hold several runs (tests run one after another into one file): a run starts at its
``# nThread`` line and ends with its table.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .._errors import CollectiveError
from ..primitives import Op, busbw_factor

# binary name -> op (nccl-tests src/*.cu, one test per binary)
PROGRAMS: dict[str, Op] = {
    "all_reduce_perf": Op.ALLREDUCE,
    "all_gather_perf": Op.ALLGATHER,
    "reduce_scatter_perf": Op.REDUCESCATTER,
    "alltoall_perf": Op.ALLTOALL,
    "broadcast_perf": Op.BROADCAST,
    "reduce_perf": Op.REDUCE,
    "sendrecv_perf": Op.SENDRECV,
    "gather_perf": Op.GATHER,
    "scatter_perf": Op.SCATTER,
}
# ops whose ``count`` column is the per-rank share, so size = count x word size x ranks (each test's
# *GetCollByteCount: paramcount = count / nranks)
PER_RANK_COUNT = (Op.ALLGATHER, Op.REDUCESCATTER, Op.ALLTOALL, Op.GATHER, Op.SCATTER)

# word size of each type name nccl-tests prints (src/common.cu test_typenames)
WORD_BYTES = {
    "int8": 1, "uint8": 1, "char": 1, "int32": 4, "int": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "half": 2, "float16": 2, "float": 4, "float32": 4, "double": 8, "float64": 8, "bfloat16": 2,
    "f8e4m3": 1, "f8e5m2": 1,
}  # fmt: skip
LEADING = ("size", "count", "type", "redop", "root")
PLACEMENT = ("time", "algbw", "busbw")  # then the check column: #wrong (>= 2.13) or error (before)
CHECK = ("#wrong", "error")
# how many leading columns the old per-test layouts had, when a table comes without its header
LEADING_BY_OP_PRE_2_13 = {
    Op.ALLREDUCE: ("size", "count", "type", "redop"),
    Op.REDUCESCATTER: ("size", "count", "type", "redop"),
    Op.ALLTOALL: ("size", "count", "type", "redop"),
    Op.ALLGATHER: ("size", "count", "type"),
    Op.SENDRECV: ("size", "count", "type"),
    Op.BROADCAST: ("size", "count", "type", "root"),
    Op.REDUCE: ("size", "count", "type", "redop", "root"),
    Op.GATHER: ("size", "count", "type", "root"),
    Op.SCATTER: ("size", "count", "type", "root"),
}

MAX_SIZE = 1 << 40  # nccl-tests sizes stop at the GPU's memory; a larger "size" is not a row

_NCCL_LINE = re.compile(r"\bNCCL (INFO|WARN|TRACE|ABORT)\b")
_NCCL_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_NGPUS = re.compile(r"\bnGpus (\d+)\b")
_NCCL_NRANKS = re.compile(r"\bnranks (\d+)\b")
# NCCL_ALGO pinned: NCCL's "NCCL_ALGO set by environment to Ring" (src/enqueue.cc / tuning.cc, INFO NCCL_ENV)
# or the variable on a command line (mpirun -x NCCL_ALGO=Ring)
_NCCL_ALGO = re.compile(r"NCCL_ALGO(?:=| set by environment to )([A-Za-z,^]+)")
_LIB_VERSION = re.compile(r"nccl-library=(\d+)")
# a launcher's label on a line: mpirun --tag-output "[1,0]<stdout>:", srun --label "3: ", MPICH/Intel MPI
# -prepend-rank "[0] "
_PREFIX = re.compile(r"^(\[\d+,\d+\]<std(out|err)>:|\d+: |\[\d+\] )")
# Open MPI's tag also lands mid-line: nccl-tests prints a row in several printf calls (the preamble, then each
# placement), each tagged (tests/reference/nccl_heldout/aws_p5_2x8_allreduce.log)
_TAG = re.compile(r"\[\d+,\d+\]<std(out|err)>:")
# an NCCL debug message glued after a fragment of a row ("      0[0] host:12:34 [0] NCCL INFO 2048 Bytes ->"):
# NCCL's prefix "host:pid:tid [dev] " (src/debug.cc ncclDebugLog; the host is gethostname's, no space or colon),
# optionally "file:line " for WARN. The host is tried only where a word starts (after a space, a colon or the
# "[0] " of MPICH's -prepend-rank): with "\S+" every position of a long run of letters was tried and each scanned
# the run to its end, O(n^2) in C where no deadline stops it (a 2 MB line ran for an hour; round 13, hostile13)
_NCCL_INLINE = re.compile(
    r"(?:\[\d+\] )?(?<![^\s:\]])[^\s:]+:\d+:\d+ \[\d+\] (?:\S+:\d+ )?NCCL (?:INFO|WARN|TRACE|ABORT)\b"
)
# a test binary, also with a NAME_SUFFIX (all_reduce_perf_mpi); unknown *_perf names are kept for the message
_PROGRAM = re.compile(r"(?<![A-Za-z0-9_])((?:" + "|".join(p[:-5] for p in PROGRAMS) + r"|[a-z][a-z_]*?)_perf)")
_RANK = re.compile(
    r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?(?:Pid\s+\d+\s+)?on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s*(.*)$"
)
_ROW_START = re.compile(r"^\s*\d+\s")
_NUMBER = re.compile(r"-?\d+(\.\d*)?([eE][-+]?\d+)?|N/A")


@dataclass(frozen=True)
class Placement:
    """One of the two measurements of a row: out-of-place or in-place."""

    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    wrong: float | None  # #wrong (>= 2.13) or the max deviation (before); None: not checked (N/A)


@dataclass(frozen=True)
class Row:
    line: int  # 1-based line number in the text
    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    out_of_place: Placement | None
    in_place: Placement | None

    @property
    def time_us(self) -> float:
        """The row's time: the mean of its out-of-place and in-place times (nccl-tests' own average
        bus bandwidth weighs both alike)."""
        times = [p.time_us for p in (self.out_of_place, self.in_place) if p is not None]
        return sum(times) / len(times)

    @property
    def printed_busbw_GBps(self) -> float:
        values = [p.busbw_GBps for p in (self.out_of_place, self.in_place) if p is not None]
        return sum(values) / len(values)


@dataclass(frozen=True)
class Run:
    """One test run: one op, one rank count, its table."""

    op: Op
    ranks: int
    hosts: tuple[str, ...]
    devices: tuple[str, ...]  # device names from the rank lines, e.g. "NVIDIA H100 80GB HBM3"
    nccl_version: str | None
    nccl_algo: str | None  # as NCCL_ALGO was set, lower case ("ring", "tree", "nvls", ...), None: NCCL chose
    rows: tuple[Row, ...]
    avg_busbw_GBps: float | None
    first_line: int
    gpus_per_process: int = 1  # -g N: one process (thread) drives N GPUs ("# nThread 1 nGpus N")

    def busbw_GBps(self, row: Row) -> float:
        """Bus bandwidth as nccl-tests computes it, from the printed time (more digits than the printed
        busbw at small sizes): size / time x factor(op, ranks) (src/<test>.cu GetBw)."""
        return busbw_factor(self.op, self.ranks) * row.size_bytes / (row.time_us * 1e-6) / 1e9


@dataclass
class _Pending:
    """A run being read."""

    first_line: int
    program: str | None = None
    ranks: dict[int, str] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)
    columns: tuple[str, ...] | None = None
    time_scale: float = 1.0  # to microseconds
    rows: list[Row] = field(default_factory=list)
    avg_busbw: float | None = None
    nranks: int | None = None
    nccl_version: str | None = None
    nccl_algo: str | None = None
    gpus_per_process: int = 1  # nccl-tests -g N


def parse(
    text: str, op: str | None = None, ranks: int | None = None, field_name: str = "text", max_rows: int = 100_000
) -> list[Run]:
    """Every run in ``text``. ``op`` / ``ranks`` override what the log says (for tables pasted without
    their header). Raises CollectiveError(field_name, 'line N: ...') on a malformed log."""
    forced = _op(op, field_name) if op is not None else None
    reader = _Reader(field_name, max_rows, forced)
    for number, raw in enumerate(text.splitlines(), start=1):
        reader.read(number, raw)
    reader._flush()
    runs = [r for r in reader.runs if r.rows]
    if not runs:
        lines = text.count("\n") + 1
        raise CollectiveError(
            field_name, f"no nccl-tests result rows found (lines starting with the size in bytes) in {lines} lines"
        )
    return [_finish(r, forced, ranks, field_name) for r in runs]


class _Reader:
    """Reads a log line by line into runs. ``context`` keeps what was read outside any run (program name,
    NCCL version, nranks, NCCL_ALGO); a run's own facts are taken until its first row, after that they
    belong to the next run."""

    def __init__(self, field_name: str, max_rows: int, forced: Op | None):
        self.field_name, self.max_rows, self.forced = field_name, max_rows, forced
        self.runs: list[_Pending] = []
        self.current: _Pending | None = None
        self.context = _Pending(0)
        self.total_rows = 0
        self.pending: tuple[int, str] | None = None  # (line, text) of a row NCCL's debug output interrupted

    @property
    def target(self) -> _Pending:
        """Where a fact read now belongs: the current run until its first row, else the context."""
        return self.current if self.current is not None and not self.current.rows else self.context

    def read(self, number: int, raw: str) -> None:
        line = _PREFIX.sub("", _TAG.sub("", raw.rstrip()) if raw.startswith("[") else raw.rstrip())
        if m := _NCCL_ALGO.search(line):
            self.target.nccl_algo = self.context.nccl_algo = m.group(1).lower()
        if (m := _NCCL_INLINE.search(line)) and m.start() > 0 and self._fragment(line[: m.start()]):
            line, debug = line[: m.start()], line[m.start() :]  # a row's fragment, then NCCL's message
            self._nccl_line(debug)
            self._partial(number, line)
            return
        if _NCCL_LINE.search(line) or _NCCL_VERSION.match(line):  # NCCL prints its version bare on rank 0
            self._nccl_line(line)
            return
        stripped = line.strip()
        if not stripped:
            return
        if self.pending is not None:
            if self._fragment(stripped) and not _ROW_START.match(line):
                self._partial(number, stripped)  # the rest of the row NCCL's messages interrupted
                return
            self._flush()
        if stripped.startswith("#"):
            self._comment(stripped.lstrip("#").strip(), number)
        elif _ROW_START.match(line):
            self._table_row(line, number)
        elif (m := _PROGRAM.search(stripped)) and m.group(1) in PROGRAMS:
            # a command line (mpirun ... ./build/all_reduce_perf -b 8 ...) names the test; anything else is
            # another program's output (mpirun, srun, the shell) and is skipped
            self.target.program = self.context.program = m.group(1)

    def _fragment(self, text: str) -> bool:
        """Whether ``text`` is a piece of a table row: a row's start, or numbers (times, bandwidths, #wrong)."""
        words = text.split()
        return bool(words) and (_ROW_START.match(text) is not None or all(_NUMBER.fullmatch(w) for w in words))

    def _partial(self, number: int, text: str) -> None:
        """Keep a row interrupted by NCCL's debug output until its pieces are all there."""
        if self.pending is None:
            self.pending = (number, text)
        else:
            self.pending = (self.pending[0], self.pending[1] + " " + text.strip())
        first, joined = self.pending
        if self._complete(joined):
            self.pending = None
            self._table_row(joined, first)

    def _complete(self, text: str) -> bool:
        run = self.current
        if run is None or run.columns is None:
            return False
        lead, per, _ = _layout(run, None, len(text.split()))
        return len(text.split()) >= len(lead) + 2 * per

    def _flush(self) -> None:
        """A row whose pieces stopped coming: read as it is (a complete row, or an error naming it)."""
        if self.pending is not None:
            first, joined = self.pending
            self.pending = None
            self._table_row(joined, first)

    def _nccl_line(self, line: str) -> None:
        target = self.target
        if m := _NCCL_VERSION.search(line):
            target.nccl_version = self.context.nccl_version = m.group(1)
        if m := _NCCL_NRANKS.search(line):
            target.nranks = self.context.nranks = int(m.group(1))

    def _comment(self, body: str, number: int) -> None:
        context = self.context
        if body.startswith("nThread") or (_starts_table(body) and (self.current is None or self.current.rows)):
            self.current = _Pending(
                number, context.program, nccl_version=context.nccl_version, nccl_algo=context.nccl_algo
            )
            self.runs.append(self.current)
        target = self.target
        if body.startswith("Collective test starting") and (m := _PROGRAM.search(body)):
            target.program = context.program = m.group(1)
        if m := _LIB_VERSION.search(body):
            target.nccl_version = context.nccl_version = _version_from_code(int(m.group(1)))
        if self.current is not None:  # its header, rank lines, column names, units, footer
            _header_line(self.current, body, number, self.field_name)

    def _table_row(self, line: str, number: int) -> None:
        if self.current is None:
            c = self.context
            self.current = _Pending(
                number, c.program, nranks=c.nranks, nccl_version=c.nccl_version, nccl_algo=c.nccl_algo
            )
            self.runs.append(self.current)
        self.current.rows.append(_row(self.current, line, number, self.field_name, self.forced))
        self.total_rows += 1
        if self.total_rows > self.max_rows:
            raise CollectiveError(self.field_name, f"line {number}: more than {self.max_rows} table rows (the limit)")


# the 2017-2019 header (src/all_reduce.cu print_header before commit cbe7f65): "bytes N type op time algbw busbw
# res", times printed in ms ("%7.3f", deltaSec x 1e3) and no units line
OLDEST = {"bytes": "size", "N": "count", "op": "redop", "res": "error"}


def _starts_table(body: str) -> bool:
    return body.split()[:2] in (["size", "count"], ["bytes", "N"])


def _header_line(run: _Pending, body: str, number: int, field_name: str) -> None:
    words = body.split()
    if words[:1] == ["nThread"] and (m := _NGPUS.search(body)):  # src/common.cu: "# nThread %d nGpus %d ..."
        run.gpus_per_process = int(m.group(1))
        return
    if words[:2] == ["bytes", "N"]:
        run.columns = tuple(OLDEST.get(w, w) for w in words)
        run.time_scale = 1e3
        return
    if words[:2] == ["size", "count"]:
        run.columns = tuple(words)
        return
    if words[:2] == ["(B)", "(elements)"]:
        run.time_scale = 1e3 if "(ms)" in words else 1.0
        return
    if m := _RANK.match("# " + body):
        run.ranks[int(m.group(1))] = m.group(2)
        run.devices.append(m.group(4).strip())
        return
    if body.startswith("Avg bus bandwidth"):
        value = body.split(":", 1)[-1].split()
        try:
            run.avg_busbw = float(value[0]) if value else None
        except ValueError:
            raise CollectiveError(field_name, f"line {number}: unreadable average bus bandwidth: {body!r}") from None


def _layout(run: _Pending, op: Op | None, tokens: int) -> tuple[tuple[str, ...], int, int]:
    """(leading column names, values per placement, index of the check column within a placement)."""
    if run.columns is not None:
        cols = run.columns
        lead = tuple(c for c in cols[: len(LEADING)] if c in LEADING)
        rest = cols[len(lead) :]
        if "timestamp" in rest:
            rest = rest[: rest.index("timestamp")]
        starts = [i for i, c in enumerate(rest) if c in ("time", "cputime")]
        per = max(starts[1] - starts[0] if len(starts) > 1 else len(rest), len(PLACEMENT))
        check = next((i for i, c in enumerate(rest[:per]) if c in CHECK), 3)
        return lead, per, check
    if op is not None and tokens == len(LEADING_BY_OP_PRE_2_13[op]) + 8:
        return LEADING_BY_OP_PRE_2_13[op], 4, 3
    return LEADING[: tokens - 8], 4, 3


def _row(run: _Pending, line: str, number: int, field_name: str, op: Op | None) -> Row:
    tokens = line.split()
    op = op or PROGRAMS.get(run.program or "")
    lead, per, check = _layout(run, op, len(tokens))

    def bad(why: str) -> CollectiveError:
        return CollectiveError(field_name, f"line {number}: {why}: {line.strip()[:200]!r}")

    if not 3 <= len(lead) <= 5:
        raise bad(f"{len(tokens)} fields, not an nccl-tests row (size count type [redop] [root] then time algbw busbw "
                  "#wrong, out-of-place and in-place)")  # fmt: skip
    body = tokens[len(lead) :]
    if len(body) not in (per, 2 * per) and not (len(body) > 2 * per and run.columns and "timestamp" in run.columns):
        raise bad(f"{len(tokens)} fields where the table has {len(lead)} leading columns and {per} per placement")
    values = dict(zip(lead, tokens, strict=False))
    size, count, dtype, root = _leading(values, bad)
    placements = [
        _placement(body[i * per : (i + 1) * per], check, run.time_scale, bad) for i in range(len(body) // per)
    ]
    placements = placements[:2]
    oop, inp = (placements[0], placements[1]) if len(placements) == 2 else (None, placements[0])
    if not (0 <= size <= MAX_SIZE and count >= 0):
        raise bad(f"size must be within 0 .. {MAX_SIZE} B (1 TiB) and count >= 0")
    # '#wrong' counts corrupted elements (>= 2.13); before, 'error'/'res' was the max deviation, which float
    # reductions legitimately make (1e-06), so only a count refuses the row
    counts = "#wrong" in run.columns if run.columns else body[check].lstrip("-").isdigit()
    for p in (oop, inp):
        if counts and p is not None and p.wrong:
            raise bad(f"#wrong = {p.wrong:g}: nccl-tests found corrupted results, so these timings are not valid")
    return Row(number, size, count, dtype, values.get("redop"), root, oop, inp)


def _leading(values: dict[str, str], bad) -> tuple[int, int, str, int | None]:
    """size, count, data type and root of a row's leading columns."""
    try:
        size, count = int(values["size"]), int(values["count"])
    except ValueError:
        raise bad("size and count must be integers") from None
    dtype = values["type"]
    if dtype not in WORD_BYTES:
        raise bad(f"unknown data type {dtype!r}; nccl-tests prints one of {', '.join(sorted(WORD_BYTES))}")
    if "root" not in values:
        return size, count, dtype, None
    try:
        return size, count, dtype, int(values["root"])
    except ValueError:
        raise bad(f"root must be an integer, got {values['root']!r}") from None


def _placement(fields: list[str], check: int, scale: float, bad) -> Placement:
    try:
        time, algbw, busbw = (float(fields[0]), float(fields[1]), float(fields[2]))
    except ValueError:
        raise bad("time, algbw and busbw must be numbers") from None
    if not (0 < time < math.inf and 0 <= algbw < math.inf and 0 <= busbw < math.inf):
        raise bad(f"time must be > 0 and bandwidths >= 0 (time {fields[0]}, algbw {fields[1]}, busbw {fields[2]})")
    mark = fields[check] if check < len(fields) else "N/A"
    try:
        wrong = None if mark == "N/A" else float(mark)
    except ValueError:
        raise bad(f"the check column must be a number or N/A, got {mark!r}") from None
    return Placement(time * scale, algbw, busbw, wrong)


def _finish(run: _Pending, forced: Op | None, ranks: int | None, field_name: str) -> Run:
    where = f"line {run.first_line}"
    op = forced or PROGRAMS.get(run.program or "")
    if op is None and run.program:
        raise CollectiveError(
            "op",
            f"{where}: cannot tell which test printed this table ({run.program} is not one of them): the log "
            f"names no {', '.join(PROGRAMS)}; give op",
        )
    if op is None:  # a bare table: what its columns prove, or a refusal naming what they leave open
        op = _op_from_columns(run, ranks or len(run.ranks) or run.nranks, where)
    counted = len(run.ranks) or run.nranks or _ranks_from_counts(op, run.rows) or _ranks_from_factor(op, run.rows)
    n = ranks or counted
    if not n:
        raise CollectiveError("ranks", f"{where}: the log has no '#  Rank' lines nor NCCL 'nranks'; give ranks")
    _check_consistent(op, n, run.rows, field_name)
    return Run(
        op=op,
        ranks=n,
        hosts=tuple(dict.fromkeys(run.ranks.values())),
        devices=tuple(dict.fromkeys(run.devices)),
        nccl_version=run.nccl_version,
        nccl_algo=run.nccl_algo,
        rows=tuple(run.rows),
        avg_busbw_GBps=run.avg_busbw,
        first_line=run.first_line,
        gpus_per_process=run.gpus_per_process,
    )


def _op_from_columns(run: _Pending, n: int | None, where: str) -> Op:
    """The op of a table that does not name its test, from what its columns prove (issue 23 item 7):

    - a root column >= 0: broadcast with redop 'none', else reduce (since 2.13 the other tests print root -1);
    - size = k x count x word size with k >= 2: a per-rank-count test on k ranks (each test's GetCollByteCount):
      reduce_scatter when the redop names a reduction; all_gather when there is no redop column (before 2.13
      only all_gather and sendrecv printed none); all_gather or alltoall when it says 'none' (both print it,
      src/all_gather.cu and src/alltoall.cu TimeTest, with the same factor): refused, naming both;
    - size = count x word size: all_reduce (busbw/algbw = 2(n-1)/n > 1 for n > 2) or sendrecv (1; it prints the
      redop too, 'sum' by default: src/common.cu ncclop). busbw/algbw is bounded by the two printed decimals of
      every row (``_factor_bounds``); a ratio that may be 1 is sendrecv only when the ranks are known and are not
      2, where all_reduce's factor is 1 too.
    Raises, naming the candidates, where the columns leave the op open."""
    row = next((r for r in run.rows if r.count), run.rows[0])
    if row.root is not None and row.root >= 0:
        return Op.BROADCAST if row.redop in (None, "none") else Op.REDUCE
    k, rest = divmod(row.size_bytes, max(1, row.count * WORD_BYTES[row.dtype]))
    if row.count and not rest and k >= 2:
        if row.redop not in (None, "none"):
            return Op.REDUCESCATTER
        if row.redop is None:
            return Op.ALLGATHER
        raise CollectiveError(
            "op",
            f"{where}: size = {k} x count x word size and redop 'none': all_gather_perf or alltoall_perf (the "
            "same columns and busbw factor); give op",
        )
    low, high = _factor_bounds(run.rows)
    if low > 1:
        return Op.ALLREDUCE
    if high < 1 or low > high:
        raise CollectiveError(
            "op",
            f"{where}: size = count x word size but busbw/algbw is within [{low:.3f}, {high:.3f}], which neither "
            "all_reduce (2(n-1)/n >= 1) nor sendrecv (1) prints; give op",
        )
    if n and n > 2 and busbw_factor(Op.ALLREDUCE, n) > high:
        return Op.SENDRECV
    on = f"{n} ranks" if n else "an unknown rank count"
    raise CollectiveError(
        "op",
        f"{where}: busbw/algbw may be 1 ([{low:.3f}, {high:.3f}]) on {on}: sendrecv_perf, or all_reduce_perf on 2 "
        "ranks (2(n-1)/n = 1); give op",
    )


def _factor_bounds(rows: list[Row]) -> tuple[float, float]:
    """Bounds on busbw / algbw that every row's two printed decimals allow (each of algbw and busbw is off by
    at most 0.005): the intersection over the rows, or the narrowest row's bounds when the rows disagree (a
    table edited by hand)."""
    bounds = []
    for r in rows:
        for p in (r.out_of_place, r.in_place):
            if p is not None and p.algbw_GBps > 0.005:
                bounds.append(
                    ((p.busbw_GBps - 0.005) / (p.algbw_GBps + 0.005), (p.busbw_GBps + 0.005) / (p.algbw_GBps - 0.005))
                )
    if not bounds:
        return 0.0, math.inf
    low, high = max(b[0] for b in bounds), min(b[1] for b in bounds)
    return (low, high) if low <= high else min(bounds, key=lambda b: b[1] - b[0])


def _ranks_from_factor(op: Op, rows: list[Row]) -> int | None:
    """The rank count an allreduce table's busbw/algbw = 2(n-1)/n allows, when only one does."""
    if op is not Op.ALLREDUCE:
        return None
    low, high = _factor_bounds(rows)
    if high < 1 or low >= 2:
        return None
    first = max(2, math.floor(2 / (2 - low)))
    last = math.ceil(2 / (2 - high)) if high < 2 else first + 2
    fits = [n for n in range(first, last + 1) if low <= busbw_factor(op, n) <= high]
    return fits[0] if len(fits) == 1 else None


def _ranks_from_counts(op: Op, rows: list[Row]) -> int | None:
    if op not in PER_RANK_COUNT:
        return None
    row = next((r for r in rows if r.count), None)
    if row is None:
        return None
    n, rest = divmod(row.size_bytes, row.count * WORD_BYTES[row.dtype])
    return n if not rest and n >= 1 else None


def _check_consistent(op: Op, n: int, rows: list[Row], field_name: str) -> None:
    """The printed columns must agree with the op and rank count: size = count x word size (x ranks for
    the per-rank ops), and busbw / algbw = nccl-tests' factor. A mismatch means the log was cut and pasted
    together or the rank count is wrong, and pricing it would be silently wrong."""
    factor = busbw_factor(op, n)
    for row in rows:
        word = WORD_BYTES[row.dtype]
        expect = row.count * word * (n if op in PER_RANK_COUNT else 1)
        if row.size_bytes != expect:
            raise CollectiveError(
                field_name,
                f"line {row.line}: size {row.size_bytes} B but count {row.count} x {word} B"
                + (f" x {n} ranks" if op in PER_RANK_COUNT else "")
                + f" = {expect} B for {op.value}: wrong op or rank count",
            )
        for p in (row.out_of_place, row.in_place):
            # only where 2 decimals carry 3 significant digits on both columns
            if p is not None and p.algbw_GBps >= 1 and p.busbw_GBps >= 1:
                ratio = p.busbw_GBps / p.algbw_GBps
                if abs(ratio - factor) > 0.02 * factor + 0.01 / p.algbw_GBps * factor:
                    raise CollectiveError(
                        "ranks",
                        f"line {row.line}: busbw/algbw = {p.busbw_GBps:g}/{p.algbw_GBps:g} = {ratio:.3f}, but "
                        f"{op.value} on {n} ranks has factor {factor:.3f} (nccl-tests): wrong op or rank count",
                    )


def _op(name: str, field_name: str) -> Op:
    key = name.strip().lower()
    if key in PROGRAMS:
        return PROGRAMS[key]
    try:
        return Op(key.replace("_", ""))
    except ValueError:
        known = ", ".join(sorted({o.value for o in PROGRAMS.values()}))
        raise CollectiveError("op", f"unknown op {name!r}; known: {known} (or the test's binary name)") from None


def _version_from_code(code: int) -> str:
    """NCCL_VERSION_CODE -> 'major.minor.patch' (nccl.h: X*10000 + Y*100 + Z since 2.9, X*1000+Y*100+Z before)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"
