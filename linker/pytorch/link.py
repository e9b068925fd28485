"""Link one PyTorch rank (host ET and/or Kineto trace) into a :class:`LinkedTrace`.

Which host ops become ops (the rule):
  Walk each ET thread root down. A ``record_function`` annotation (ET scope USER_SCOPE: e.g.
  ``ProfilerStep#3``, ``## forward ##``, ``Optimizer.step#SGD.step``, ``nn.Module: ...``) that
  has children is a transparent container: descend into it. Every other node reached is a
  *top-level host op*: a COMPUTE op with its Kineto time, and none of its descendants becomes
  an op, so host time is never counted twice. Work nested inside it stays represented through
  it: device work it launched gets a LAUNCH edge from it; a collective under it is either a
  device op (NCCL kernels) or, when it ran on the CPU (gloo), an extra op (see below).
  Without an ET the same rule runs on Kineto's nesting: the outermost ``cpu_op`` ranges per
  thread (``user_annotation`` ranges are the containers). Exception: the collector's
  ``moe_routing:*`` annotations are ops (the router's work), so routing bins can hang on them.

Collectives:
  NCCL / RCCL kernels become COLLECTIVE device ops (SEND / RECV for ``SendRecv`` used for
  point-to-point; ``SendRecv`` under an all-to-all is ALL_TO_ALL). c10d ops that launched no
  device work (gloo on CPU, or an ET without Kineto) become COLLECTIVE / SEND / RECV ops
  themselves, marked ``on_device=True`` on lane ``comm:<pg>``: gloo runs them on its own
  threads, and ASTRA-sim rejects COMM nodes that are CPU ops. A top-level c10d op is replaced
  by its comm op; a nested one is added beside its top-level op (PARENT edge from it, HOST_ORDER
  edge to the op after it). A c10d call on GPU tensors (or, without an ET, in a trace with
  device work) that launched no kernel (NCCL with a zero-size input) stays a host op: it moved
  nothing.

Device ops: every ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` (HtoD -> MEM_LOAD, DtoH ->
MEM_STORE, others COMPUTE with their bytes). When Kineto covers more steps than the ET, only
device work launched inside the ET's window is kept.

Edges (each from an earlier to a later start, so the graph stays acyclic): HOST_ORDER
between consecutive top-level ops of a thread, LAUNCH host op -> device op (by
``correlation``, or the ``ac2g`` flow, then the launching runtime call's enclosing range),
STREAM_ORDER between consecutive ops of a stream, SYNC (see :mod:`chakra_hooks.linker.pytorch.edges`), and DATA
between host ops on different threads (same-thread order is already HOST_ORDER): through
ET tensor ids, and forward op -> backward op through autograd sequence numbers (ET
``seq_id`` or Kineto ``Sequence number``), which is what ties the autograd thread to the
forward pass.

Memory: the ET is read first and its raw bytes are released as soon as the top-level ops
are known (their inputs / outputs are kept as JSON text); only then is Kineto read, a chunk
of events at a time, so neither raw file coexists with the other's decoded events.
"""

from __future__ import annotations

import importlib
from bisect import bisect_left
from collections import defaultdict
from datetime import datetime, timezone
from operator import attrgetter
from pathlib import Path

import orjson

from chakra_hooks.common import progress
from chakra_hooks.common.errors import TraceFormatError, json_kind
from chakra_hooks.linker.pytorch import edges as pytorch_edges
from chakra_hooks.linker.gc_pause import gc_paused
from chakra_hooks.linker.pytorch.kineto import DEVICE_CATS, KinetoTrace, read_kineto
from chakra_hooks.linker.pytorch.kineto_events import KEvent
from chakra_hooks.linker.model import (PS_PER_NS, CommInfo, CommType, Edge, EdgeKind,
                                       LinkedTrace, Op, OpKind, TensorIO)
from chakra_hooks.linker.pytorch.comms import (C10D_OPS, CommMeta, classify, from_c10d_et,
                                               from_c10d_kineto, from_kineto_args,
                                               kineto_input_empty,
                                               from_nccl_annotation, from_record_param_comms,
                                               kernel_collective)
from chakra_hooks.linker.pytorch.et import USER_SCOPE, HostEt, read_host_et
from chakra_hooks.linker.pytorch.et_nodes import EtNode
from chakra_hooks.linker.pytorch.groups import Groups
from chakra_hooks.linker.pytorch.match import Match, index_threads, match_et
from chakra_hooks.linker.pytorch.waits import split_host_ops
from chakra_hooks.linker.sources import RankJob

PG_INIT = "## process_group:init ##"
RPC = "record_param_comms"
# More device events than this share starting before their launch (by correlation id): the
# ids are damaged (none of ~20,000 in the corpus's traces does), so none links a launch.
ACAUSAL_SHARE = 0.01
# Enum members read per op or per edge, bound once: reading one off its class goes through
# EnumType's __getattr__ hook, about ten times the cost of a module global.
_COMPUTE, _COLLECTIVE, _METADATA = OpKind.COMPUTE, OpKind.COLLECTIVE, OpKind.METADATA
_HOST_ORDER, _LAUNCH, _STREAM_ORDER = EdgeKind.HOST_ORDER, EdgeKind.LAUNCH, EdgeKind.STREAM_ORDER
_C_LAUNCH = _LAUNCH  # (a C constant compiled: link.pxd)
_COPY_KINDS = {"HtoD": OpKind.MEM_LOAD, "DtoH": OpKind.MEM_STORE}
WINDOW_MIN_OUTSIDE = 0.10  # Kineto ranges outside the ET's span before we cut to its window
LOW_MATCH = 0.5  # below this match rate a pair is reported as two different runs
# An ET and a Kineto trace of two processes (their pids differ) are two runs: they pair only
# when the program repeated itself op for op (the corpus's ResNet pair: 100 %; a ResNet ET
# with another GPU's ResNet profile matched 62.9 %, with 119 ops left without a duration).
CROSS_RUN_MATCH = 0.95
# Annotations that are ops themselves rather than containers: the MoE router annotation our
# collector writes (linker/enrich/routing.py hangs the routing bins on it), and the KV-cache transfer
# ranges of the vLLM collector's connector (linker/enrich/kv.py makes them MEM_LOAD / MEM_STORE).
OPAQUE_ANNOTATIONS = ("moe_routing:", "kv:")
# How far down the top-level ops (other threads' interleaved) the next op of a thread is looked
# for: an annotation emptied by the ET holds it.
_SAME_THREAD_WITHIN = 64
_INT64 = 1 << 63
# gloo runs each collective under a ``gloo:<name>`` range on a thread of its own: that is the
# collective's own execution (waiting for its peers included), which the comm op stands for;
# as a host op too it would count the time twice.
GLOO_RANGE = "gloo:"
# Annotation ranges kept for the steps after linking (LinkedTrace.annotations): vLLM's
# per-engine-step annotations and the KV-cache ranges.
KEPT_ANNOTATIONS = ("execute_", "kv:")
SIDECARS = (("routing", "chakra_hooks.linker.enrich.routing"), ("kv", "chakra_hooks.linker.enrich.kv"))
# The range our PyTorch collector wraps each collective in: chakra_pg:<process group name>.
GROUP_ANNOTATION = "chakra_pg:"
# A rank's share of its conversion done once each file is read (progress.reached): the ET
# and the Kineto trace each take about a fifth, linking a quarter, the converter the rest.
PROGRESS_ET_READ, PROGRESS_KINETO_READ = 0.2, 0.4


def load(job: RankJob) -> list[LinkedTrace]:
    """Loader entry point (see linker/sources.py)."""
    trace = link(job.files.get("host_et"), job.files.get("kineto"), job.rank,
                 force_pair=bool(job.options.get("force_pair")))
    for key in ("host", "host_clock"):  # which ranks share a machine, and a clock (peers.py)
        if key in job.options:
            trace.metadata[key] = job.options[key]
    if trace.annotations:
        importlib.import_module("chakra_hooks.linker.enrich.engine_steps").tag(trace)
    # Sidecars of our collectors: role -> the module whose attach(trace, path) adds them.
    for role, module in SIDECARS:
        path = job.files.get(role)
        if path is not None:
            importlib.import_module(module).attach(trace, path)
    trace.annotations = []
    return [trace]


def link(host_et_path: Path | None, kineto_path: Path | None, rank: int | None = None,
         force_pair: bool = False) -> LinkedTrace:
    """Read and link one rank's host ET and/or Kineto trace.

    An ET and a Kineto trace of which fewer than LOW_MATCH of the ET's ops match are two
    different runs: refused (TraceFormatError, saying what matched), unless ``force_pair``
    (then linked, with a warning)."""
    if host_et_path is None and kineto_path is None:
        raise ValueError("link() needs a host ET, a Kineto trace or both")
    with gc_paused():  # millions of small containers, none in a reference cycle
        # ET first, and its top-level ops selected (which frees its raw bytes) before Kineto
        # is read: the ET's raw file, its decoded nodes and Kineto's events never coexist.
        et = read_host_et(host_et_path) if host_et_path is not None else None
        selected = select_et(et) if et is not None else None
        progress.reached(PROGRESS_ET_READ)
        kt = read_kineto(kineto_path) if kineto_path is not None else None
        progress.reached(PROGRESS_KINETO_READ)
        linker = PytorchLinker(et, kt, rank, selected)
        selected = None  # the linker lets go of the ET's nodes before it is done
        trace = linker.build()
        rate = trace.stats.get("match_rate")
        two_runs = bool(trace.stats.get("pids_differ"))
        bar = CROSS_RUN_MATCH if two_runs else LOW_MATCH
        if et is not None and kt is not None and rate is not None and rate < bar \
                and not force_pair:
            pids = ", ".join(map(str, sorted(kt.pids, key=str)))
            which = (f"; the pids differ (ET {et.pid}, Kineto {pids}): "
                     f"two runs pair when at least {CROSS_RUN_MATCH:.0%} of the ET's ops match, "
                     "as a deterministic program's runs do" if two_runs else "")
            raise TraceFormatError(
                f"{host_et_path} and {kineto_path}", "pairing",
                f"an ET and a Kineto trace of one run; only {trace.stats['host_matched']} of "
                f"{trace.stats['host_ops']} ET ops ({rate:.1%}, by "
                f"{trace.metadata.get('match_strategy')}) match the Kineto trace{which}. "
                "Convert them apart (one file per convert), or link them anyway with "
                "--force-pair")
        if rate is not None and LOW_MATCH <= rate < bar:  # two runs, paired by --force-pair
            trace.warnings.append(
                f"{host_et_path} and {kineto_path}: two runs (the pids differ) of which "
                f"{rate:.1%} of the ET's ops match, linked as one (--force-pair)")
        return trace


class PytorchLinker:
    """One linking run of a rank's host ET and Kineto trace. Its steps are methods, called in
    order by :meth:`build`; the passes that cut host ops (waits.py) and find edges (edges.py)
    are functions of the state it holds: ``et``, ``kt``, ``trace`` with its ``ops`` and
    ``edges``, ``launches``, ``host_waits``, ``runtime_by_corr`` and ``window``."""

    def __init__(self, et: HostEt | None, kt: KinetoTrace | None, rank: int | None,
                 selected: tuple[list[EtNode], list[EtNode]] | None = None) -> None:
        self.et, self.kt = et, kt
        if rank is None:
            rank = kt.rank if kt is not None and kt.rank is not None else 0
        clock = kt.clock if kt is not None else (
            "et:ts-us (Kineto times a reference-linked ET carries, no base)"
            if et is not None and any(n.ts is not None for n in et.nodes[:64])
            else "none (host ET only: no times)")
        self.trace = LinkedTrace(rank=rank, framework="pytorch", clock=clock)
        self.ops, self.edges = self.trace.ops, self.trace.edges
        self.threads = index_threads(kt.host) if kt is not None else {}
        clipped = [ev for th in self.threads.values() for ev in th.clipped]
        if clipped:
            self.trace.metadata["kineto_ops_clipped"] = len(clipped)
            self.trace.warnings.append(
                f"{kt.path}: {len(clipped)} op calls end after the range they were called in "
                f"(e.g. {clipped[0].name[:60]!r}): cut to its end, so that the ops after it "
                "are not taken for its children")
        self.match = Match()
        self.groups = Groups(self._world_size())
        # ET id (rpc or its parent) -> metadata; without an ET, the id() of the Kineto range
        self.rpc_meta: dict[int, CommMeta] = {}
        self.c10d_on_device: set[int] = set()  # id() of Kineto c10d ranges that launched kernels
        # id() of Kineto events the file gave no duration (their ops say duration_unknown)
        self.unknown_dur: set[int] = {id(ev) for ev in kt.unknown_dur} if kt is not None else set()
        self.window: tuple[int, int] | None = None
        self.left_out_host = self.left_out_device = 0  # Kineto events outside the window
        # Device ops will exist: Kineto has some, or a reference-linked ET carries them.
        self.has_device = bool(kt.device) if kt is not None else (
            et is not None and any(n.cat in DEVICE_CATS for n in et.nodes))
        # The device trace holds communication kernels (NCCL / RCCL). When it has none, a
        # collective call on GPU tensors that moved bytes has lost its kernels (a profile
        # without them), not run without any: it becomes a COMM node timed by the call.
        self.comm_on_device = False
        self.host_timed = 0  # such collectives
        self.seqs: dict[str, list[int]] = defaultdict(list)  # host lane -> top-level op uids
        self.nested_after: dict[int, list[int]] = defaultdict(list)  # top uid -> nested comm
        self.thread_ops: dict[tuple, list[tuple[int, int]]] = defaultdict(list)  # Kineto thread
        self.launches: list[tuple[KEvent, int, str]] = []  # (runtime call, device uid, lane)
        # blocking calls: (thread, call start ns, call end ns, awaited device uids)
        self.host_waits: list[tuple[tuple, int, int, list[int]]] = []
        # top-level ET ops, in program order per thread, and process-group init nodes
        self.selected = selected
        self.tops: list[EtNode] = []
        self.pg_inits: list[EtNode] = []
        self.lanes: dict[tuple, str] = {}  # (device, stream, pid, tid) -> lane name
        self.runtime_by_corr: dict[object, KEvent] = {}
        self.kernel_names: dict[str, str | None] = {}  # kernel name -> kernel_collective()
        self.gloo_runs: list[tuple[Op, KEvent]] = []  # host-side comm op, its gloo range
        # (device events, a start after today or None, Kineto's first and last times if a
        # window was cut): what _finish reads of Kineto's events, kept by _release_kineto
        self.kineto_facts: tuple | None = None

    # ----------------------------------------------------------------------------- steps
    def build(self) -> LinkedTrace:
        if self.et is not None:
            self.tops, self.pg_inits = self.selected or select_et(self.et)
        self._read_groups()
        if self.et is not None and self.kt is not None:
            self.match = match_et(self.et, self.kt.host, self.threads)
            self._choose_window()
            self._promote_escaped()
            self._read_through_emptied()
        device_links = self._prelink_device() if self.kt is not None else []
        self.comm_on_device = self._device_has_comm()
        data_edges = None
        if self.et is not None:
            self._host_ops_from_et()
            # Read from the ET's nodes now, added in their place below: nothing after this
            # reads the nodes, and they go before the device ops and the edges are made.
            data_edges = pytorch_edges.data_edges(self)
            self._release_et()
        else:
            self._host_ops_from_kineto()
        for ev, runtime, inner in device_links:
            self._device_op(ev, runtime, inner)
        device_links = None  # their events go with Kineto's (_release_kineto)
        self._gloo_spans()
        if self.et is not None:  # without an ET, Kineto's ranges give the autograd edges
            self._release_kineto()
        self._order_edges()
        pytorch_edges.add_sync_edges(self)
        if data_edges is not None:
            self.edges.extend(data_edges)
            data_edges = None
        elif self.kt is not None:
            pytorch_edges.add_kineto_autograd_edges(self)
        self._release_inputs()
        split_host_ops(self)
        self._gloo_execution()
        self._finish()
        if self.host_timed:
            self.trace.metadata["comm_host_timed"] = self.host_timed
            self.trace.warnings.append(
                f"{self.host_timed} collectives recorded on the host have no device kernel "
                "(the device trace holds no communication kernels): kept as COMM nodes timed "
                "by their host calls (comm_host_timed)")
        return self.trace

    def _release_kineto(self) -> None:
        """Let go of Kineto's host ranges and device events, and what indexes them, once every
        op exists (and, without an ET, the autograd edges read from the ranges): the steps
        after this read the runtime calls and ``cuda_sync`` records (add_sync_edges), the
        gloo ranges and a few counts, taken here. The memory let go is reused by the edges
        and the cut host ops made after it, rather than added to it: a rank's peak was the
        end of linking, with both inputs whole. Done once."""
        kt = self.kt
        if kt is not None and self.kineto_facts is None:
            annotations = []
            for ev in kt.host:  # a loop, not a comprehension: the compiled build types ``ev``
                if ev.cat == "user_annotation" and ev.name.startswith(KEPT_ANNOTATIONS):
                    annotations.append((ev.name, ev.start * PS_PER_NS, ev.dur * PS_PER_NS,
                                        f"thread:{ev.tid}"))
            self.trace.annotations = annotations
            span = None
            if self.window is not None:
                span = (min([ev.start for ev in kt.host] + [ev.start for ev in kt.device]),
                        max([ev.start + ev.dur for ev in kt.host]
                            + [ev.start + ev.dur for ev in kt.device]))
            self.kineto_facts = (len(kt.device), kt.starts_in_the_future(), span)
            kt.host, kt.device = [], []
            kt.flow_ends, kt.ids, kt.names = {}, {}, {}
            self.threads = {}
        self.match.release()
        # ids of events now freed: a new object may take one
        self.unknown_dur, self.c10d_on_device = set(), set()

    def _release_et(self) -> None:
        """Let go of the ET's nodes once the host ops and the data edges are read from them;
        the path, schema, pid, warnings and size stay for the metadata."""
        et = self.et
        et.nodes, et.by_id = [], {}
        self.selected, self.tops, self.pg_inits = None, [], []

    def _release_inputs(self) -> None:
        """Let go of the rest of Kineto once the edges read from it exist: cutting the host
        ops (split_host_ops) and the steps after it read only the launches' runtime calls,
        the gloo ranges and the counts kept."""
        self._release_kineto()
        if self.kt is not None:
            self.kt.runtime, self.kt.syncs = [], []
            self.runtime_by_corr = {}

    def _device_has_comm(self) -> bool:
        """Whether any device event is a communication kernel."""
        if self.kt is None:
            return self.et is not None and any(
                n.cat == "kernel" and kernel_collective(n.name) is not None for n in self.et.nodes)
        names = self.kernel_names  # _device_op's cache: each kernel name classified once
        for ev in self.kt.device:
            if ev.cat != "kernel":
                continue
            if ev.args.collective_name is not None:
                return True
            coll = names.get(ev.name, False)
            if coll is False:
                coll = names[ev.name] = kernel_collective(ev.name)
            if coll is not None:
                return True
        return False

    def _world_size(self) -> int | None:
        if self.kt is not None and self.kt.world_size:
            return self.kt.world_size
        return None

    def _read_groups(self) -> None:
        if self.kt is not None:
            self.groups.add_pg_config(self.kt.distributed.get("pg_config"))
        if self.et is None:
            return
        for node in self.et.nodes:
            if node.name == PG_INIT and node.inputs.values:
                self.groups.add_pg_config(node.inputs.values[0])
            elif node.name == RPC:
                meta = from_record_param_comms(node)
                if meta is None or meta.name == "wait":
                    continue
                self.groups.add(meta.pg_name, meta.ranks)
                self.rpc_meta[node.id] = meta
                self.rpc_meta.setdefault(node.parent, meta)

    def _choose_window(self) -> None:
        """Cut Kineto to the ET's span when Kineto clearly recorded more (more steps)."""
        matched = self.match.by_et.values()
        if not matched:
            return
        # Plain loops: these run over every matched and every host event (generators cost
        # more than the comparisons).
        lo = hi = None
        for ev in matched:
            start = ev.start
            end = start + ev.dur
            if lo is None or start < lo:
                lo = start
            if hi is None or end > hi:
                hi = end
        ops = outside = 0
        for ev in self.kt.host:
            if ev.cat == "cpu_op":
                ops += 1
                if ev.start < lo or ev.start > hi:
                    outside += 1
        if ops and outside / ops > WINDOW_MIN_OUTSIDE:
            self.window = (lo, hi)
            self.left_out_host = outside

    def _promote_escaped(self) -> None:
        """Top-level ops the ET nests under ops that had ended before they began.

        The ET observer nests each op under the op open on its thread's stack; an async
        collective (a ``gloo:*`` range opened by the caller and closed on gloo's thread, as
        DDP's gradient all-reduces and ``all_reduce(async_op=True)`` are) leaves that stack
        wrong, and the ops after it come out nested under earlier ones (a backward op inside
        the backward op before it). Kineto's intervals say what ran inside what: an ET
        descendant whose Kineto range is not inside its top-level op's (same thread, start
        within the op) ran after it, and is a top-level op itself, placed after the op that
        held it (ET ids follow program order). Without this they and their time were lost."""
        by_et = self.match.by_et
        if not by_et:
            return
        tops: list[EtNode] = []
        promoted: list[EtNode] = []
        for top in self.tops:
            tops.append(top)
            ev = by_et.get(top.id)
            if ev is not None and top.children and _may_escape(top, ev, by_et):
                found: list[EtNode] = []
                _escaped(top.children, ev, by_et, found)
                tops.extend(found)
                promoted.extend(found)
        if not promoted:
            return
        self.tops = tops
        self.et.recover_io(promoted)
        self.trace.stats["et_nesting_corrected"] = len(promoted)
        self.trace.warnings.append(
            f"{self.et.path}: {len(promoted)} ops are nested in the ET under ops that had "
            "ended before they began (Kineto's times; an async collective leaves the ET "
            "observer's nesting wrong): converted as the top-level ops they were")

    def _read_through_emptied(self) -> None:
        """Annotations the ET left without children while the ops after them ran inside them.

        The same broken stack (``_promote_escaped``) can hang an annotation's ops from the one
        around it instead (DDP's last ``DistributedDataParallel.forward`` of a window, its
        ``device_sleep``s children of the ``ProfilerStep``): the annotation then reads as a
        top-level op of its own, its time counted twice beside the ops it held, and the op
        after it waiting for nothing on its thread. An annotation with no children whose
        Kineto range holds the next top-level op of its thread is read through, as an
        annotation with children is (``select_et``)."""
        by_et = self.match.by_et
        if not by_et:
            return
        tops, kept, emptied = self.tops, [], 0
        for i, top in enumerate(tops):
            ev = by_et.get(top.id)
            if (ev is not None and not top.children and top.scope == USER_SCOPE
                    and not top.name.startswith(OPAQUE_ANNOTATIONS)):
                nxt = next((by_et[t.id] for t in tops[i + 1:i + 1 + _SAME_THREAD_WITHIN]
                            if t.id in by_et and by_et[t.id].tid == ev.tid
                            and by_et[t.id].pid == ev.pid), None)
                if nxt is not None and ev.start <= nxt.start and nxt.dur < ev.dur \
                        and nxt.start + nxt.dur <= ev.start + ev.dur:
                    emptied += 1
                    continue
            kept.append(top)
        if not emptied:
            return
        self.tops = kept
        self.trace.stats["et_emptied_annotations"] = emptied
        self.trace.warnings.append(
            f"{self.et.path}: {emptied} annotation(s) have no children in the ET, while the "
            "ops after them ran inside them (Kineto's times; an async collective leaves the ET "
            "observer's nesting wrong): read through, as annotations with children are")

    def _prelink_device(self) -> list[tuple[KEvent, KEvent | None, KEvent | None]]:
        """Device event -> its launching runtime call and the innermost host range around it."""
        kt = self.kt
        runtime_by_corr = {}
        for rt in kt.runtime:  # ids only: a damaged value links nothing
            corr = rt.args.correlation
            if type(corr) is int:
                runtime_by_corr[corr] = rt
        threads, flows, window = self.threads, kt.flow_ends, self.window
        by_ext: dict | None = None  # host ranges by External id, built on first need
        out = []
        launched = []
        linked = acausal = 0
        for ev in sorted(kt.device, key=_START):
            corr = ev.args.correlation
            if corr is None:
                corr = flows.get((ev.pid, ev.tid, ev.start))
            elif type(corr) is not int:
                corr = None  # refused with its event in _device_op (_check_ids)
            runtime = runtime_by_corr.get(corr)
            if runtime is not None:
                linked += 1
                if ev.start < runtime.start:  # ran before its launch: not its launch
                    acausal += 1
                    runtime = None
            launched.append((ev, runtime))
        damaged = acausal > linked * ACAUSAL_SHARE
        if acausal:
            self._unlinked_launches(acausal, linked, damaged)
        if damaged:
            runtime_by_corr = {}
            launched = [(ev, None) for ev, _ in launched]
        self.runtime_by_corr = runtime_by_corr
        for ev, runtime in launched:
            if window is not None:
                # launched outside the steps the ET recorded; without a launch, run outside
                at = runtime.start if runtime is not None else ev.start if acausal else None
                if at is None or not window[0] <= at <= window[1]:
                    self.left_out_device += 1
                    continue
            inner = None
            if runtime is not None:
                th = threads.get((runtime.pid, runtime.tid))
                inner = th.innermost(runtime.start) if th is not None else None
                if inner is None and runtime.args.external_id is not None:
                    # Outside every range of its thread (clock rounding at a range's edge):
                    # newer Kineto names the launching op by External id.
                    if by_ext is None:
                        by_ext = {e.args.external_id: e for e in kt.host
                                  if e.args.external_id is not None}
                    inner = by_ext.get(runtime.args.external_id)
                anc = inner
                while anc is not None:
                    if anc.name in C10D_OPS:
                        self.c10d_on_device.add(id(anc))
                    anc = anc.parent
            out.append((ev, runtime, inner))
        return out

    def _unlinked_launches(self, acausal: int, linked: int, damaged: bool) -> None:
        """Device events that started before the runtime call their correlation id names."""
        unlinked = linked if damaged else acausal
        self.trace.metadata["kineto_launch_unlinked"] = unlinked
        self.trace.warnings.append(
            f"{self.kt.path}: {acausal} of {linked} device events start before the runtime "
            "call their correlation id names (no kernel runs before its launch): "
            + (f"the trace's correlation ids are damaged; none of the {linked} is linked to a "
               "launch" if damaged else "those are not linked to it"))

    # ------------------------------------------------------------------------- host ops
    def _host_ops_from_et(self) -> None:
        by_et, tops = self.match.by_et, self.tops
        for node in self.pg_inits:
            self._metadata_op(node.name, node.inputs.values[0] if node.inputs.values else "",
                              f"thread:et{node.tid}", node.id)
        lane_of = self._et_thread_lanes(tops)
        top_uid: dict[int, int] = {}
        for node in tops:
            op = self._et_host_op(node, by_et.get(node.id), lane_of[node.tid])
            top_uid[node.id] = op.uid
            self.seqs[lane_of[node.tid]].append(op.uid)
        self._nested_c10d(top_uid)
        if self.kt is None:
            self._et_device_ops(top_uid)
        for op in self.ops:
            if op.kind == _METADATA:
                break
        else:  # the ET recorded no process-group init: Kineto's configuration, if any
            self._kineto_pg_metadata()

    def _et_device_ops(self, top_uid: dict[int, int]) -> None:
        """Device nodes a reference-linked ET carries (``cat`` kernel / gpu_memcpy /
        gpu_memset under their launching op), used when there is no Kineto trace."""
        by_id = self.et.by_id
        for node in self.et.nodes:
            if node.cat not in DEVICE_CATS:
                continue
            ev = _et_event(node)
            kind, comm, meta = _COMPUTE, None, None
            if ev.cat == "kernel" and kernel_collective(node.name) is not None:
                meta = from_record_param_comms(node)
                found = classify(meta.name if meta else kernel_collective(node.name) or "")
                if found is not None:
                    kind, ctype = found
                    comm = self._comm_info(kind, ctype, meta)
                    if kind in _P2P and (comm.src is None or comm.dst is None):
                        kind, comm = _COMPUTE, None  # no peer: see _kernel_comm
            elif ev.cat == "gpu_memcpy":
                kind = _COPY_KINDS.get(node.name[7:11], kind)
            op = self._add(node.name, kind, True, f"stream:0:{node.stream}", None)
            op.start_ps, op.dur_ps, op.comm = ev.start * PS_PER_NS, ev.dur * PS_PER_NS, comm
            op.attrs.update(category=ev.cat, et_id=node.id)
            if meta is not None:
                _split_attrs(op, meta)
            anc = by_id.get(node.parent)
            while anc is not None and anc.id not in top_uid and anc.parent != anc.id:
                anc = by_id.get(anc.parent)
            if anc is not None and anc.id in top_uid:
                self.edges.append(Edge(top_uid[anc.id], op.uid, _LAUNCH))

    def _et_thread_lanes(self, tops: list[EtNode]) -> dict[int, str]:
        """ET tid -> lane, named after the Kineto thread most of its matched ops ran on."""
        # (plain loops and dicts: the compiled build types `node`, `ev` and the dicts, link.pxd)
        votes: dict[object, dict[object, int]] = {}
        by_et = self.match.by_et
        for node in tops:
            ev = by_et.get(node.id)
            if ev is not None:
                counts = votes.get(node.tid)
                if counts is None:
                    counts = votes[node.tid] = {}
                counts[ev.tid] = counts.get(ev.tid, 0) + 1
        lanes = {}
        for node in tops:
            if node.tid not in lanes:
                v = votes.get(node.tid)
                lanes[node.tid] = (f"thread:{max(v, key=v.get)}" if v
                                   else f"thread:et{node.tid}")
        return lanes

    def _et_host_op(self, node: EtNode, ev: KEvent | None, lane: str) -> Op:
        if ev is None and self.kt is None and node.ts is not None:
            ev = _et_event(node)  # times a reference-linked ET carries
        if node.name in C10D_OPS and self._c10d_on_host(node, ev):
            op = self._c10d_comm_op(node, ev, lane)
        else:
            op = self._add(node.name, _COMPUTE, False, lane, ev)
            op.attrs["et_id"] = node.id
        op.inputs = TensorIO(*node.io_text())
        op.outputs = TensorIO(*node.io_text(outputs=True))
        return op

    def _c10d_on_host(self, node: EtNode, ev: KEvent | None) -> bool:
        """A c10d op is a host-side collective when it launched no device work and its
        tensors are not on a GPU (gloo on CPU tensors)."""
        if ev is not None and id(ev) in self.c10d_on_device:
            return False
        # On GPU tensors, in a trace with device work, the kernels are the collective: when
        # they are not linked to this call, they still stand for it; when the call launched
        # none (NCCL with a zero-size input waits on an event and moves nothing), a comm node
        # would be work that never ran. Either way the call is a host op. Unless the device
        # trace has no communication kernel at all: then they were not recorded.
        if not (self.has_device and node.on_gpu()):
            return True
        if self.comm_on_device:
            return False
        kind, ctype = classify(node.name) or (_COLLECTIVE, None)
        meta = self.rpc_meta.get(node.id) or from_c10d_et(node)
        return meta.size_for(ctype) > 0

    def _c10d_comm_op(self, node: EtNode, ev: KEvent | None, caller: str) -> Op:
        meta = self.rpc_meta.get(node.id) or from_c10d_et(node)
        if meta.pg_name is None:
            meta.pg_name = _et_annotated_group(self.et.by_id, node)
        kind, ctype = classify(node.name) or (_COLLECTIVE, None)
        if node.name == "c10d::alltoall_base_":
            ctype = CommType.ALL_TO_ALL
        op = self._add(node.name, kind, True, f"comm:{meta.pg_name or 'default'}", ev)
        op.comm = self._comm_info(kind, ctype, meta)
        op.attrs["et_id"] = node.id
        op.attrs["host_side_collective"] = True
        op.attrs["calling_lane"] = caller  # the thread whose time precedes the call
        if self.has_device and node.on_gpu():  # kernels not recorded (_c10d_on_host)
            op.attrs["comm_host_timed"] = True
            self.host_timed += 1
        _split_attrs(op, meta)
        return op

    def _nested_c10d(self, top_uid: dict[int, int]) -> None:
        """c10d ops nested under a top-level op that ran on the CPU get their own comm op."""
        by_id = self.et.by_id
        for node in self.et.nodes:
            if node.name not in C10D_OPS or node.id in top_uid:
                continue
            anc = by_id.get(node.parent)
            while anc is not None and anc.id not in top_uid and anc.parent != anc.id:
                anc = by_id.get(anc.parent)
            if anc is None or anc.id not in top_uid:
                continue
            ev = self.match.by_et.get(node.id)
            if not self._c10d_on_host(node, ev):
                continue
            op = self._c10d_comm_op(node, ev, self.ops[top_uid[anc.id]].lane)
            op.inputs, op.outputs = TensorIO(*node.io_text()), TensorIO(*node.io_text(True))
            parent = top_uid[anc.id]
            self.edges.append(Edge(parent, op.uid, EdgeKind.PARENT))
            self.nested_after[parent].append(op.uid)

    def _host_ops_from_kineto(self) -> None:
        nested = []  # c10d calls inside a top-level op
        if self.has_device and not self.comm_on_device:
            self._kineto_rpc_meta()
        for key, th in self.threads.items():
            lane = f"thread:{key[1]}"
            for ev in th.events:
                if ev.cat != "cpu_op" and not ev.name.startswith(OPAQUE_ANNOTATIONS):
                    continue
                if _inside_gloo_range(ev):
                    continue
                if _inside_host_op(ev):
                    if ev.name in C10D_OPS:
                        nested.append((ev, lane))
                    continue
                meta = self._kineto_c10d_on_host(ev)
                if meta is not None:
                    op = self._kineto_c10d_comm_op(ev, meta, lane)
                else:
                    op = self._add(ev.name, _COMPUTE, False, lane, ev)
                self.seqs[lane].append(op.uid)
        for ev, lane in nested:  # beside their top-level op, as _nested_c10d does
            meta = self._kineto_c10d_on_host(ev)
            if meta is None:
                continue
            op = self._kineto_c10d_comm_op(ev, meta, lane)
            parent = _top_op_of(ev)
            if parent >= 0:
                self.edges.append(Edge(parent, op.uid, EdgeKind.PARENT))
                self.nested_after[parent].append(op.uid)
        self._kineto_pg_metadata()

    def _kineto_c10d_on_host(self, ev: KEvent) -> CommMeta | None:
        """The metadata of a c10d call that is a host-side collective, else None. Without an
        ET the tensors' device is unknown: in a trace with device work, a c10d call that
        launched none is a host op (see _c10d_on_host), unless the device trace holds no
        communication kernel and the call was not recorded with an empty input."""
        if ev.name not in C10D_OPS or id(ev) in self.c10d_on_device:
            return None
        if self.has_device and (self.comm_on_device or kineto_input_empty(ev.name, ev.args)):
            return None
        return from_c10d_kineto(ev.name, ev.args)

    def _kineto_rpc_meta(self) -> None:
        """Collective metadata of ``record_param_comms`` ranges, by the id() of the c10d
        range they are in or around (for collectives the device trace lost: newer Kineto
        records sizes and groups there, and tensor lists' shapes nowhere else)."""
        for th in self.threads.values():
            for ev in th.events:
                if ev.name != RPC or ev.args.collective_name is None:
                    continue
                meta = from_kineto_args(ev.args)
                if meta is None:
                    continue
                anc = ev.parent
                if anc is not None and anc.name in C10D_OPS:
                    self.rpc_meta[id(anc)] = meta
                else:
                    self.rpc_meta[id(ev)] = meta

    def _kineto_c10d_comm_op(self, ev: KEvent, meta: CommMeta, lane: str) -> Op:
        found = self.rpc_meta.get(id(ev)) or (
            self.rpc_meta.get(id(ev.parent)) if ev.parent is not None else None)
        if found is not None:
            meta = found
        if meta.pg_name is None:
            meta.pg_name = _kineto_annotated_group(ev)
        kind, ctype = classify(ev.name) or (_COLLECTIVE, None)
        op = self._add(ev.name, kind, True, "comm:default", ev)
        op.comm = self._comm_info(kind, ctype, meta)
        op.attrs["host_side_collective"] = True
        op.attrs["calling_lane"] = lane
        if self.has_device:
            op.attrs["comm_host_timed"] = True
            self.host_timed += 1
        return op

    def _gloo_spans(self) -> None:
        """A host-side collective lasts until its ``gloo:<name>`` range ended: the c10d call
        only queues the work (~80 us) and one of gloo's threads runs it, waiting for the
        peers. The range is created inside the call, so it has the first record function id
        after the call's: each range goes to the latest call created before it. Traces
        without those ids: each comm op, in start order, takes the first gloo range that
        starts within it or after it (and before the next one's start), which holds while
        gloo runs one collective at a time (DDP's buckets run on several threads at once)."""
        if self.kt is None:
            return
        ranges = []
        for ev in self.kt.host:  # loops, not generators: the compiled build types ``ev``
            if ev.name.startswith(GLOO_RANGE):
                ranges.append(ev)
        ranges.sort(key=_START)
        if not ranges:
            return
        paired = self._gloo_by_record_function(ranges)
        if paired is not None:
            for op, ev in paired:
                _extend_to(op, ev)
                self.gloo_runs.append((op, ev))
            return
        comms = []
        for op in self.ops:
            if op.attrs.get("host_side_collective") and op.start_ps is not None:
                comms.append(op)
        comms.sort(key=_START_PS)
        starts = [ev.start * PS_PER_NS for ev in ranges]
        used = set()
        for op, following in zip(comms, [*comms[1:], None]):
            k = bisect_left(starts, op.start_ps)
            limit = following.start_ps if following is not None else None
            while k < len(ranges) and k in used:
                k += 1
            if k == len(ranges) or (limit is not None and starts[k] >= limit):
                continue
            used.add(k)
            _extend_to(op, ranges[k])
            self.gloo_runs.append((op, ranges[k]))

    def _gloo_execution(self) -> None:
        """A host-side collective's time is two waits and its run: the call queues the work,
        the work waits for a thread of gloo's to be free (the collective before it on that
        thread), then runs (its peers' arrival included). After the calling ops are cut at the
        calls (split_host_ops, which needs the call's time), each comm op becomes its gloo
        range, depending on the call (as before) and on the collective that ran before it on
        the same gloo thread: what it queued behind is an edge, so that a what-if that
        shortens one collective starts the ones queued behind it earlier. What neither
        explains is slack on the calling thread (linker/enrich/gaps.py)."""
        if not self.gloo_runs:
            return
        by_thread: dict[tuple, list[tuple[int, Op]]] = defaultdict(list)
        for op, ev in self.gloo_runs:
            start = ev.start * PS_PER_NS
            if start > op.start_ps:
                op.attrs["issued_ns"] = op.start_ps // 1000  # when the call queued it
                # Never below 0: a call cut before gloo began its work (split_host_ops) would
                # end before its start (by 3-4 ns, once in several DDP runs).
                op.dur_ps = max(op.start_ps + op.dur_ps - start, 0)
                op.start_ps = start
                op.attrs["gloo_thread"] = ev.tid  # whose slack comes before it (gaps.py)
            by_thread[(ev.pid, ev.tid)].append((start, op))
        edges = self.edges
        for runs in by_thread.values():
            runs.sort(key=_FIRST)
            for (_, before), (_, after) in zip(runs, runs[1:]):
                edges.append(Edge(before.uid, after.uid, EdgeKind.SYNC))

    def _gloo_by_record_function(self, ranges: list[KEvent]) -> list[tuple[Op, KEvent]] | None:
        """(comm op, its gloo range) paired by record function ids (see _gloo_spans), or
        None where the trace lacks them."""
        calls = []
        ops = self.ops
        for ev in self.kt.host:
            rf = ev.args.record_function_id
            if ev.op >= 0 and type(rf) is int and rf > 0 and \
                    ops[ev.op].attrs.get("host_side_collective"):
                calls.append((rf, ev.op))
        if not calls:
            return None
        for ev in ranges:
            rf = ev.args.record_function_id
            if type(rf) is not int or rf <= 0:
                return None
        calls.sort()
        call_ids = [rf for rf, _ in calls]
        paired, used = [], set()
        for ev in sorted(ranges, key=_RECORD_FUNCTION_ID):
            i = bisect_left(call_ids, ev.args.record_function_id) - 1
            if i >= 0 and i not in used:
                used.add(i)
                paired.append((ops[calls[i][1]], ev))
        return paired

    def _metadata_op(self, name: str, config: object, lane: str, et_id: int | None) -> None:
        text = config if isinstance(config, str) else orjson.dumps(config).decode()
        op = self._add(name, _METADATA, False, lane, None)
        op.attrs["pg_config"] = text
        if et_id is not None:
            op.attrs["et_id"] = et_id

    def _kineto_pg_metadata(self) -> None:
        configs = self.kt.distributed.get("pg_config") if self.kt is not None else None
        if configs:
            self._metadata_op("process_group:config", configs, "metadata", None)

    # ----------------------------------------------------------------------- device ops
    def _device_op(self, ev: KEvent, runtime: KEvent | None, inner: KEvent | None) -> None:
        args = ev.args
        device, stream = args.device, args.stream
        key = (device, stream, ev.pid, ev.tid)
        try:
            lane = self.lanes.get(key)
        except TypeError:  # a list where an id belongs: _check_ids says so
            lane = None
        if lane is None:
            self._check_ids(ev)  # once per lane: a new lane is where a bad value shows first
            lane = f"stream:{ev.pid if device is None else device}:" \
                   f"{ev.tid if stream is None else stream}"
            self.lanes[key] = lane
        kind, comm, nbytes, meta, collective = _COMPUTE, None, None, None, None
        cat = ev.cat
        if cat == "kernel":
            coll = self.kernel_names.get(ev.name, False)
            if coll is not None or args.collective_name is not None:  # else plain COMPUTE
                kind, comm, meta, collective = self._kernel_comm(ev, inner)
        else:
            nbytes = _copy_bytes(ev)
            if cat == "gpu_memcpy":
                direction = ev.name[7:11] if ev.name.startswith("Memcpy ") else args.kind
                kind = _COPY_KINDS.get(direction, kind)
        ops = self.ops
        # What _add does for an op without a host range, with the times and bytes at once.
        op = Op(len(ops), ev.name, kind, True, lane, ev.start * PS_PER_NS, ev.dur * PS_PER_NS,
                comm, nbytes)
        ops.append(op)
        attrs = op.attrs
        attrs["category"] = cat
        if self.unknown_dur and id(ev) in self.unknown_dur:
            attrs["duration_unknown"] = True
        if meta is not None:
            _split_attrs(op, meta)
        if collective is not None:
            attrs["collective"] = collective
            if comm is None:
                attrs["comm_unresolved"] = "kind or peer unknown: replayed as compute"
        # Device and stream are in the lane name; the correlation leads back to Kineto.
        corr = args.correlation
        if corr is not None:
            if type(corr) is not int or not -_INT64 <= corr < _INT64:
                self._check_ids(ev)  # raises, naming the field
            attrs["correlation"] = corr
        if runtime is None:
            return
        self.launches.append((runtime, op.uid, lane))
        host = inner
        while host is not None and host.op < 0:
            host = host.parent
        if host is not None:
            self.edges.append(Edge(host.op, op.uid, _LAUNCH))

    def _check_ids(self, ev: KEvent) -> None:
        """A device event's stream, device and correlation are integers: anything else is
        damage, not an id to link by."""
        args = ev.args
        # CUPTI / ROCm number devices and streams from 0 in 32 bits; a correlation id is any
        # 64-bit integer.
        for name, value, low, high, kind in (
                ("stream", args.stream, 0, 1 << 32, "a stream number (0 to 2**32 - 1)"),
                ("device", args.device, 0, 1 << 32, "a device number (0 to 2**32 - 1)"),
                ("correlation", args.correlation, -_INT64, _INT64, "an integer of 64 bits")):
            if value is not None and (type(value) is not int or not low <= value < high):
                raise TraceFormatError(self.kt.path, f"{ev.cat} {ev.name[:60]!r} at "
                                       f"{ev.start} ns", f"args.{name}: {kind}, got "
                                       f"{json_kind(value)}")

    def _kernel_comm(self, ev: KEvent, inner: KEvent | None
                     ) -> tuple[OpKind, CommInfo | None, CommMeta | None, str | None]:
        """(kind, comm, metadata, collective name) of a kernel; COMPUTE unless NCCL / RCCL."""
        coll = self.kernel_names.get(ev.name, False)
        if coll is False:  # names are interned and repeat: look each one up once
            coll = self.kernel_names[ev.name] = kernel_collective(ev.name)
        meta = from_kineto_args(ev.args) if ev.args.collective_name is not None else None
        if coll is None and meta is None:
            return _COMPUTE, None, None, None
        anc_meta, anc_name = self._ancestor_comm(inner)
        meta = meta or anc_meta
        for name in (meta.name if meta else None, anc_name, coll):
            found = classify(name) if name else None
            if found is not None:
                kind, ctype = found
                info = self._comm_info(kind, ctype, meta)
                if kind in _P2P and (info.src is None or info.dst is None):
                    # A SendRecv whose launch is not in the trace: no peer, so no valid
                    # point-to-point node; replayed by its duration (comm_unresolved says so).
                    return _COMPUTE, None, meta, name
                return kind, info, meta, name
        return _COMPUTE, None, meta, coll  # e.g. RCCL "Generic" without metadata

    def _ancestor_comm(self, anc: KEvent | None) -> tuple[CommMeta | None, str | None]:
        """Collective metadata from the host ranges around a launch (record_param_comms,
        the c10d op, an ``nccl:*`` annotation), innermost first."""
        name, fallback = None, None
        while anc is not None:
            if anc.name == RPC:
                meta = from_kineto_args(anc.args)
                if meta is None and anc.et is not None:
                    meta = self.rpc_meta.get(anc.et)
                if meta is not None and meta.name != "wait":
                    return meta, name
            elif anc.et is not None and anc.et in self.rpc_meta:
                return self.rpc_meta[anc.et], name
            if name is None and (anc.name in C10D_OPS or anc.name.startswith("nccl:")):
                name = anc.name
            if anc.name in C10D_OPS:
                shapes = from_c10d_kineto(anc.name, anc.args)
                if shapes.in_bytes or shapes.out_bytes:  # in and out: better than nccl:*
                    return shapes, name
            elif fallback is None and anc.name.startswith("nccl:"):
                fallback = from_nccl_annotation(anc.name, anc.args)
            anc = anc.parent
        return fallback, name

    def _comm_info(self, kind: OpKind, ctype: CommType | None, meta: CommMeta | None
                   ) -> CommInfo:
        if meta is None:
            return CommInfo(0, ctype if kind == _COLLECTIVE else None)
        info = CommInfo(meta.size_for(ctype), ctype if kind == _COLLECTIVE else None,
                        self.groups.resolve(meta.pg_name, meta.ranks))
        if kind in (OpKind.SEND, OpKind.RECV):
            me = self.trace.rank
            info.src, info.dst = (me, meta.peer) if kind == OpKind.SEND else (meta.peer, me)
            info.tag = meta.tag if meta.tag is not None else 0
        return info

    # ---------------------------------------------------------------------------- edges
    def _order_edges(self) -> None:
        edges, nested = self.edges, self.nested_after
        for uids in self.seqs.values():
            for a, b in zip(uids, uids[1:]):
                edges.append(Edge(a, b, _HOST_ORDER))
                for c in nested.get(a, ()):
                    edges.append(Edge(c, b, _HOST_ORDER))
        lanes: dict[str, list[Op]] = defaultdict(list)
        for op in self.ops:
            if op.on_device and op.start_ps is not None and op.lane.startswith("stream:"):
                lanes[op.lane].append(op)
        for ops in lanes.values():
            ops.sort(key=_START_PS)  # stable: equal starts stay in uid order
            for a, b in zip(ops, ops[1:]):
                edges.append(Edge(a.uid, b.uid, _STREAM_ORDER))

    # --------------------------------------------------------------------------- finish
    def _add(self, name: str, kind: OpKind, on_device: bool, lane: str, ev: KEvent | None
             ) -> Op:
        op = Op(len(self.ops), name, kind, on_device, lane)
        if ev is not None:
            op.start_ps, op.dur_ps = ev.start * PS_PER_NS, ev.dur * PS_PER_NS
            if self.unknown_dur and id(ev) in self.unknown_dur:
                op.attrs["duration_unknown"] = True
            ev.op = op.uid
            self.thread_ops[(ev.pid, ev.tid)].append((ev.start, op.uid))
        self.ops.append(op)
        return op

    def _finish(self) -> None:
        pytorch_edges.prune_edges(self)
        trace, et, kt = self.trace, self.et, self.kt
        trace.groups = self.groups.table()
        data_parallel = self.groups.data_parallel()
        if data_parallel:
            trace.metadata["data_parallel_groups"] = data_parallel
        unresolved, subgroups = self.groups.unresolved, self.groups.subgroups()
        if unresolved:
            trace.stats["comm_group_unknown"] = unresolved
            if subgroups:  # with no subgroup in the run, "all ranks" is the only answer
                trace.warnings.append(
                    f"{unresolved} collectives do not say which process group they ran on; "
                    f"they are taken to span all ranks, but the run has subgroups "
                    f"{subgroups[:4]}: record with the chakra-hooks torch collector, which "
                    "records each call's group")
        launched = set()  # (plain loops, not comprehensions: the compiled build types `e`, `op`)
        for e in self.edges:
            kind = e.kind  # (compiled: a C integer)
            if kind == _C_LAUNCH:
                launched.add(e.dst)
        _mark_unknown_sizes(self.ops)
        device_ops = device_linked = device_time = 0
        for op in self.ops:
            if op.on_device and op.lane.startswith("stream:"):
                device_ops += 1
                device_linked += op.uid in launched
                device_time += op.dur_ps or 0
        stats = trace.stats
        stats["ops"] = len(self.ops)
        stats["edges"] = len(self.edges)
        stats["device_ops"] = device_ops
        stats["device_linked"] = device_linked
        stats["device_time_ps"] = device_time
        stats["window_applied"] = int(self.window is not None)
        if self.window is not None:
            self._report_left_out()
        if kt is not None:
            device_events, future, _ = self.kineto_facts
            stats["kineto_device_events"] = device_events
            stats["input_bytes"] = stats.get("input_bytes", 0) + kt.raw_bytes
            trace.metadata.update(kineto_file=kt.path.name, kineto_events=kt.events_total)
            _say_doubts(kt, trace, stats)
            if kt.duplicates:
                stats["duplicate_events"] = kt.duplicates
                trace.warnings.append(f"{kt.path}: {kt.duplicates} exact repeats of earlier "
                                      "events dropped (the file holds some events twice)")
            if kt.unknown_dur:
                stats["duration_unknown"] = len(kt.unknown_dur)
                trace.warnings.append(f"{kt.path}: {len(kt.unknown_dur)} events have no 'dur'; "
                                      "their nodes say duration_unknown (0 us, not measured)")
            if future is not None:
                when = datetime.fromtimestamp(future / 1e9, timezone.utc).strftime("%Y-%m-%d")
                trace.metadata["kineto_clock_suspect"] = f"starts {when}, after the conversion"
                trace.warnings.append(f"{kt.path}: events start on {when}, after today: "
                                      "baseTimeNanoseconds or the recording clock is wrong, and "
                                      "times across files may not line up")
            pids = sorted([p for p in kt.pids if type(p) is int])
            if pids:
                trace.metadata["kineto_pid"] = pids[0]
        if et is not None:
            stats["input_bytes"] = stats.get("input_bytes", 0) + et.raw_bytes
            trace.metadata.update(schema=et.schema, host_et_file=et.path.name)
            if et.pid is not None:
                trace.metadata["pid"] = et.pid
            trace.warnings.extend(et.warnings)
        if et is not None and kt is not None:
            self._report_match()
        trace.metadata["clock"] = trace.clock
        world = self._world_size()
        if world:  # how many ranks the run had, recorded or not (converter/peers.py)
            trace.metadata["world_size"] = world

    def _report_left_out(self) -> None:
        """Kineto recorded more than the ET (a profiler left running beside an observer started
        for one step): what was left out is said, counted and kept in the metadata."""
        trace, kt = self.trace, self.kt
        lo, hi = self.window
        first, last = self.kineto_facts[2]
        text = (f"{self.left_out_host} host ops and {self.left_out_device} device events of the "
                f"Kineto trace lie outside the host ET's window ({(lo - first) / 1e6:,.3f} to "
                f"{(hi - first) / 1e6:,.3f} ms of Kineto's {(last - first) / 1e6:,.3f} ms): left out")
        trace.stats["kineto_left_out_host"] = self.left_out_host
        trace.stats["kineto_left_out_device"] = self.left_out_device
        trace.metadata["kineto_left_out"] = text
        trace.warnings.append(f"{kt.path}: {text}")

    def _report_match(self) -> None:
        trace, m = self.trace, self.match
        stats = trace.stats
        stats["host_ops"] = m.eligible
        stats["host_matched"] = m.matched
        stats["match_rate"] = round(m.rate, 4)
        trace.metadata["match_strategy"] = m.strategy
        names = f"{self.et.path} and {self.kt.path}"
        pid_differs = self.et.pid is not None and self.et.pid not in self.kt.pids
        stats["pids_differ"] = pid_differs
        if m.rate < LOW_MATCH:
            trace.warnings.append(
                f"{names}: only {m.matched} of {m.eligible} host ops "
                f"({m.rate:.0%}) match Kineto{' and the pids differ' if pid_differs else ''}: "
                "they look like two different runs; host times and launches are incomplete")
        elif pid_differs:
            trace.metadata["note"] = (f"ET pid {self.et.pid} is not Kineto's; the traces are two "
                                      f"runs of one program ({m.rate:.1%} of host ops match)")


_P2P = (OpKind.SEND, OpKind.RECV)


def _mark_unknown_sizes(ops: list[Op]) -> None:
    """A communication op of 0 bytes, other than a barrier, was recorded without its sizes
    (no record_param_comms, no c10d shapes, no NCCL metadata): say so instead of passing 0
    off as measured. ``validate --target astra-sim`` refuses such nodes (a simulator would
    move nothing)."""
    for op in ops:
        comm = op.comm
        if comm is not None and not comm.size_bytes and comm.comm_type != CommType.BARRIER:
            op.attrs["comm_size_unknown"] = True


_START = attrgetter("start")
_START_PS = attrgetter("start_ps")


def _FIRST(pair: tuple) -> object:  # noqa: N802 (a sort key)
    return pair[0]


def _RECORD_FUNCTION_ID(ev: KEvent) -> int:  # noqa: N802 (a sort key)
    return ev.args.record_function_id


def _extend_to(op: Op, gloo_range: KEvent) -> None:
    """A host-side comm op lasts from its call to the end of its gloo range."""
    end = (gloo_range.start + gloo_range.dur) * PS_PER_NS
    if op.start_ps is not None and end > op.start_ps + op.dur_ps:
        op.attrs["queued_duration_ps"] = op.dur_ps  # the c10d call's own time
        op.dur_ps = end - op.start_ps


def select_et(et: HostEt) -> tuple[list[EtNode], list[EtNode]]:
    """Apply the top-level rule (module docstring) to the ET, then let the ET free its raw
    bytes, keeping the inputs / outputs of the nodes that will be read.
    Returns (top-level ops, process-group init nodes)."""
    tops: list[EtNode] = []
    pg_inits: list[EtNode] = []
    for root in et.thread_roots():
        stack = list(reversed(root.children))
        while stack:
            node = stack.pop()
            if node.cat is not None:
                continue  # a device node of a reference-linked ET: see _et_device_ops
            if node.name == PG_INIT:
                pg_inits.append(node)
            elif node.name.startswith(GLOO_RANGE):
                # The collective's execution (its comm op's time, _gloo_spans), which gloo runs
                # on a thread of its own. The ET observer opens the range on the calling
                # thread and closes it on gloo's, so the caller's next ops come out nested in
                # it: they are the caller's own ops, read as if the range were not there.
                stack.extend(reversed(node.children))
            elif _is_container(node):
                stack.extend(reversed(node.children))
            else:
                tops.append(node)
    c10d: list[EtNode] = []
    decoded: list[EtNode] = []
    for n in et.nodes:
        name = n.name
        if name in C10D_OPS:
            c10d.append(n)
        elif name == RPC or name == PG_INIT or (
                n.cat == "kernel" and kernel_collective(name) is not None):
            decoded.append(n)
    et.release_raw(tops + c10d, decoded + c10d)
    return tops, pg_inits


def _is_container(node: EtNode) -> bool:
    """A record_function annotation with children, read through (module docstring)."""
    return (node.scope == USER_SCOPE and bool(node.children)
            and not node.name.startswith(OPAQUE_ANNOTATIONS))


def _may_escape(top: EtNode, outer: KEvent, by_et: dict) -> bool:
    """Whether any ET descendant of ``top`` may lie outside its Kineto range ``outer``: the
    ET numbers a thread's ops in the order they began, and children lists are in id order,
    so the last node down the last children began last; when it began inside ``outer`` on
    its thread, so did every other descendant, and the subtree needs no walk (on the ResNet
    corpus rank, every one of its 14k nodes would be visited otherwise)."""
    node = top
    while node.children:
        node = node.children[-1]
    ev = by_et.get(node.id)
    return ev is None or not (ev.pid == outer.pid and ev.tid == outer.tid
                              and ev.start <= outer.start + outer.dur)


def _escaped(children: list[EtNode], outer: KEvent, by_et: dict, found: list[EtNode]) -> None:
    """ET descendants (in program order) whose Kineto range lies outside ``outer``'s, the
    range of the op the ET nests them in (see PytorchLinker._promote_escaped); an escaped
    op is the outer range for its own descendants. An escaped annotation (``Optimizer.step``
    nested in a backward op) is a container again: what it holds follows the top-level rule
    of select_et (``outer`` None below it). gloo ranges are looked through."""
    stack = [(child, outer) for child in reversed(children)]
    while stack:  # every node of the ET below a top-level op: names are read only on escape
        node, ref = stack.pop()
        if node.cat is not None:
            continue
        ev = by_et.get(node.id)
        if (ref is None or (ev is not None and not (
                ev.pid == ref.pid and ev.tid == ref.tid
                and ref.start <= ev.start <= ref.start + ref.dur))) \
                and not node.name.startswith(GLOO_RANGE):
            if node.name == PG_INIT:
                continue
            if _is_container(node):
                ref = None
            else:
                found.append(node)
                if ev is None:
                    continue  # no times to tell its descendants' place by: they stay in it
                ref = ev
        if node.children:
            stack.extend([(child, ref) for child in reversed(node.children)])


def _et_event(node: EtNode) -> KEvent:
    """A stand-in Kineto event for an ET node that carries Kineto times itself."""
    ts, dur = node.ts, node.inclusive_dur or 0
    try:
        start = ts * 1000 if type(ts) is int else round(ts * 1000)
        length = dur * 1000 if type(dur) is int else round(dur * 1000)
    except TypeError as exc:
        raise TraceFormatError("host ET", f"node {node.id}", "numeric 'ts' / 'inclusive_dur'"
                               ) from exc
    return KEvent(node.name, str(node.cat or "cpu_op"), pid=0, tid=node.tid, start=start,
                  dur=length)


def _et_annotated_group(by_id: dict, node: EtNode) -> str | None:
    """The process group our collector's ``chakra_pg:<name>`` range around an ET c10d op names
    (gloo records the op's group argument as '<Object>'); None without one."""
    anc = by_id.get(node.parent)
    while anc is not None:
        if anc.name.startswith(GROUP_ANNOTATION):
            return anc.name[len(GROUP_ANNOTATION):]
        if anc.parent == anc.id:
            break
        anc = by_id.get(anc.parent)
    return None


def _kineto_annotated_group(ev: KEvent) -> str | None:
    """The same for a Kineto c10d range."""
    anc = ev.parent
    while anc is not None:
        if anc.name.startswith(GROUP_ANNOTATION):
            return anc.name[len(GROUP_ANNOTATION):]
        anc = anc.parent
    return None


def _inside_gloo_range(ev: KEvent) -> bool:
    anc = ev.parent
    while anc is not None:
        if anc.name.startswith(GLOO_RANGE):
            return True
        anc = anc.parent
    return False


def _top_op_of(ev: KEvent) -> int:
    """The uid of the outermost op around a host range, -1 if none."""
    found, anc = -1, ev.parent
    while anc is not None:
        if anc.op >= 0:
            found = anc.op
        anc = anc.parent
    return found


def _inside_host_op(ev: KEvent) -> bool:
    anc = ev.parent
    while anc is not None:
        if anc.cat == "cpu_op" or anc.name.startswith(OPAQUE_ANNOTATIONS):
            return True
        anc = anc.parent
    return False


def _copy_bytes(ev: KEvent) -> int | None:
    nbytes = ev.args.bytes
    if type(nbytes) is int:
        return nbytes
    bandwidth = ev.args.bandwidth
    if isinstance(bandwidth, (int, float)):
        return round(bandwidth * ev.dur)  # GB/s x ns = bytes
    return None


def _split_attrs(op: Op, meta: CommMeta) -> None:
    if meta.in_split:
        op.attrs["in_split_size"] = meta.in_split
    if meta.out_split:
        op.attrs["out_split_size"] = meta.out_split
    op.attrs["collective"] = meta.name


__all__ = ["load", "link", "TraceFormatError"]


def _say_doubts(kt, trace, stats: dict) -> None:
    """The Kineto events the reader did not keep as they were, said and counted: events of op
    and kernel categories that are not complete events, and events whose time cannot belong
    to the trace (linker/pytorch/kineto.py). (Apart from _finish, which the compiled build
    makes a cpdef method: those take no generator expressions.)"""
    if kt.other_phases:
        count = sum(kt.other_phases.values())
        stats["other_phase_events"] = count
        trace.metadata["kineto_other_phases"] = count
        shown = ", ".join(f"{n} {cat} " + (f"with ph {ph!r}" if ph else "without ph")
                          for (cat, ph), n in sorted(kt.other_phases.items(),
                                                     key=lambda kv: -kv[1])[:3])
        trace.warnings.append(f"{kt.path}: {count} events of op / kernel categories are "
                              f"not complete events (ph 'X') and were not read: {shown}")
    if kt.out_of_range:
        far = kt.out_of_range
        stats["out_of_range_events"] = len(far)
        trace.metadata["kineto_out_of_range"] = len(far)
        shown = ", ".join(repr(ev.name[:40]) for ev in far[:3])
        trace.warnings.append(f"{kt.path}: {len(far)} events dropped whose time cannot "
                              f"belong to the trace (starting over a day from the rest, "
                              f"or lasting over a day: {shown})")
