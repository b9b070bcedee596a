"""The seed's backend-assignment passes 1-4 of ``ggml_backend_sched_split_graph`` (and the
in-place-writer rule between passes 3 and 4): an :class:`Assigner` the scheduler holds.

What flows in and out is data, an :class:`Assignment`: ``backend_of`` (tensor -> backend index)
and ``cause`` (tensor -> the rule that placed it, see ``Scheduler.report``), plus the
``offload_op`` answers pass 1 used. The assigner owns only its answer memos: ``supports_op``
asked once per (node, backend) per split (and, for devices that allow it, once per node key for
the scheduler's life) and ``supports_buft`` once per (backend, buffer type).
"""

from __future__ import annotations

from typing import Any

from ggmlpy.backend.interface import Backend, BufferType, BufferUsage
from ggmlpy.core.errors import UnsupportedOpError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import VIEW_OPS, Op
from ggmlpy.core.tensor import Flag, Tensor

__all__ = ["Assigner", "Assignment", "node_key", "op_memo_token", "OP_KEY_MEMO_SIZE"]

_INPUT = int(Flag.INPUT)
_NO_COMPUTE = frozenset(VIEW_OPS) | {Op.NONE}
#: ops that do not follow their weights (ggml: ROPE's and FLASH_ATTN_EXT's extra inputs)
_NO_WEIGHTS_RULE = (Op.ROPE, Op.FLASH_ATTN_EXT)
_int_and = int.__and__  # C-level test of IntFlag bits (Flag.__and__ is Python code)


#: most ``supports_op`` answers a scheduler keeps by node key (the memo is emptied when full)
OP_KEY_MEMO_SIZE = 1 << 16


def _mem_kind(t: Tensor) -> tuple | None:
    buf = t._buffer
    if buf is None and t.view_src is not None:
        buf = t.view_src._buffer
    return None if buf is None else (buf.__class__, buf.buft)


def node_key(node: Tensor) -> tuple:
    """What a kernel-registry ``supports_op`` reads from ``node``: op, type, ``ne``, ``nb``
    (bytes), ``op_params``, whether it is a view, and per source its op, type, ``ne``, ``nb`` and
    the class and buffer type of its memory (None when unplaced). Raises TypeError when an
    ``op_params`` value is unhashable."""
    srcs = []
    for s in node.src:
        if s is None:
            srcs.append(None)
            continue
        buf = s._buffer  # (_mem_kind written out)
        if buf is None and s.view_src is not None:
            buf = s.view_src._buffer
        srcs.append((s.op, s.type, s.ne, s.nb, None if buf is None else (buf.__class__, buf.buft)))
    return (node.op, node.type, node.ne, node.nb, tuple(node.op_params), node.view_src is None,
            tuple(srcs))


def op_memo_token(backend: Backend) -> Any:
    """The token under which ``backend.supports_op`` answers may be memoised by
    :func:`node_key` (the device's ``supports_op_memo_token()``), or None: the backend and its
    device must not override ``supports_op`` and the device must offer a token (CPU and the
    async devices do; any other device is asked every time)."""
    if type(backend).supports_op is not Backend.supports_op or "supports_op" in vars(backend):
        return None
    return backend.device.supports_op_memo_token()


class Assignment:
    """Where the tensors of one split run (the state passes 1-4 produce, pass 5 and the report
    read, user pins seed).

    Attributes:
        backend_of: tensor -> backend index (into the scheduler's backends).
        cause: tensor -> the rule that placed it (``usr``, ``1.dst``, ... ``5.cpy``).
        offload_asked: ``[(tensor, backend index, answer)]`` of every ``offload_op`` call pass 1
            made (a split template replays only with the same answers).
    """

    __slots__ = ("backend_of", "cause", "offload_asked")

    def __init__(self, backend_of: dict[Tensor, int] | None = None,
                 cause: dict[Tensor, str] | None = None) -> None:
        self.backend_of: dict[Tensor, int] = {} if backend_of is None else backend_of
        self.cause: dict[Tensor, str] = {} if cause is None else cause
        self.offload_asked: list[tuple[Tensor, int, bool]] = []

    def copy(self) -> Assignment:
        """A copy whose dicts can change without touching this one's."""
        a = Assignment(dict(self.backend_of), dict(self.cause))
        a.offload_asked = list(self.offload_asked)
        return a


def _bid(bo: dict[Tensor, int], t: Tensor | None) -> int:
    return -1 if t is None else bo.get(t, -1)


class Assigner:
    """Passes 1-4 of the seed's split over an :class:`Assignment` (see the module docstring).

    Args:
        backends: the scheduler's backends, in priority order (the last a CPU).
        bufts: their compute buffer types.
        op_offload: let pass 1 ask higher-priority backends' ``offload_op``.
    """

    def __init__(self, backends: list[Backend], bufts: list[BufferType], op_offload: bool) -> None:
        self.backends = backends
        self.bufts = bufts
        self.op_offload = op_offload
        self._op_memo: dict[int, bool] = {}  # id(node) << 4 | backend index, this split's
        self._op_key_memo: dict[tuple, bool] = {}  # supports_op by node key, across splits
        self._op_tokens: list[Any] = [None] * len(backends)
        self._bid_of_buft: dict[BufferType, int] = {}  # first backend using a buffer type
        self._buft_memo: dict[tuple[int, BufferType], bool] = {}

    @property
    def op_key_memo_keys(self) -> frozenset[tuple]:
        """The keys of the ``supports_op`` memo that lives across splits (read-only snapshot):
        ``(backend index, the backend's memo token, node key)`` per answer remembered
        (:func:`op_memo_token`, :func:`node_key`). Backends without a token are asked every
        split and leave no key. Emptied when it reaches ``OP_KEY_MEMO_SIZE`` entries; kept by
        :meth:`begin` (and so by the scheduler's ``reset``)."""
        return frozenset(self._op_key_memo)

    def begin(self) -> None:
        """Start a split: forget this split's ``supports_op`` answers (a node's sources may have
        changed) and read every backend's memo token again (:func:`op_memo_token`)."""
        self._op_memo = {}
        self._op_tokens = [op_memo_token(b) for b in self.backends]

    def assign(self, graph: Graph, a: Assignment) -> None:
        """Passes 1-4 (and the in-place-writer rule, and the view-source access check) over
        ``graph``, completing ``a`` (assignments already there, user pins, are kept). Call
        :meth:`begin` first.

        Raises:
            UnsupportedOpError: as the passes (a node no backend supports, a pre-allocated
                tensor no capable backend can use, an in-place writer that cannot reach its
                memory).
        """
        nodes = graph.nodes
        compute_nodes = [n for n in nodes if n.op not in VIEW_OPS]
        self._pass1_assign_preallocated(a, graph)
        self._pass2_expand_assignments(a, compute_nodes)
        self._pass3_upgrade_to_higher_prio(a, compute_nodes)
        self._pass3b_inplace_writers_follow_memory(a, compute_nodes)
        self._pass4_assign_remaining_srcs(a, nodes)
        self._check_view_src_access(a, nodes)

    def _op_ok(self, b: int, node: Tensor) -> bool:
        """``backends[b].supports_op(node)``, asked once per (node, backend) per split (the
        answers are dropped at the next :meth:`split_graph`: a node's sources may change), and
        for backends whose device allows it (:func:`op_memo_token`) answered from a memo keyed
        by the node's key (:func:`node_key`) that lives across splits."""
        key = id(node) << 4 | b  # (an int: no tuple per (node, backend); b < MAX_BACKENDS = 16)
        r = self._op_memo.get(key)
        if r is None:
            tok = self._op_tokens[b]
            if tok is None:
                r = bool(self.backends[b].supports_op(node))
            elif node.op in _NO_COMPUTE:
                r = True  # (what Device.supports_op answers for them, not overridden here)
            else:
                try:
                    k = (b, tok, node_key(node))
                    r = self._op_key_memo.get(k)
                except TypeError:  # an unhashable op_params value: ask
                    k = None
                if r is None:
                    r = bool(self.backends[b].supports_op(node))
                    if k is not None:
                        if len(self._op_key_memo) >= OP_KEY_MEMO_SIZE:
                            self._op_key_memo.clear()
                        self._op_key_memo[k] = r
            self._op_memo[key] = r
        return r

    def _buft_ok(self, b: int, buft: BufferType) -> bool:
        """``backends[b].supports_buft(buft)``, asked once per (backend, buffer type) for the
        scheduler's life (a device's buffer-type support does not change)."""
        key = (b, buft)
        r = self._buft_memo.get(key)
        if r is None:
            r = self._buft_memo[key] = bool(self.backends[b].supports_buft(buft))
        return r

    def _backend_from_buffer(self, t: Tensor, op: Tensor) -> int:
        buf = t._buffer
        if buf is None:
            return -1
        buft = buf.buft
        if op.op is Op.NONE and None not in self._op_tokens:
            # every backend runs op NONE (Device.supports_op, not overridden: see op_memo_token):
            # the answer depends on the buffer type alone
            r = self._bid_of_buft.get(buft)
            if r is None:
                r = next((i for i in range(len(self.backends)) if self._buft_ok(i, buft)), -1)
                self._bid_of_buft[buft] = r
            return r
        # a WEIGHTS buffer on a device: any backend that can read it and run the op
        for i in range(len(self.backends)):
            if self._buft_ok(i, buft) and self._op_ok(i, op):
                return i
        return -1

    def _backend_id_from_cur(self, a: Assignment, t: Tensor) -> tuple[int, str]:
        b = self._backend_from_buffer(t, t)
        if b >= 0:
            return b, "1.dst"
        if t.view_src is not None:
            b = self._backend_from_buffer(t.view_src, t)
            if b >= 0:
                return b, "1.vsrc"
        if t.buffer is not None or (t.view_src is not None and t.view_src.buffer is not None):
            buf = t.buffer if t.buffer is not None else t.view_src.buffer  # type: ignore[union-attr]
            raise UnsupportedOpError(
                f"Scheduler: pre-allocated tensor '{t.name}' ({t.op.name}) is in a {buf.name} "
                f"buffer that no backend able to run its op can use (if another Scheduler or "
                f"GraphAllocator placed it, call its reset() or free() first)")
        if _int_and(t.flags, _INPUT):
            return len(self.backends) - 1, "1.inp"
        if t.op not in _NO_WEIGHTS_RULE:
            for s in t.src:
                if s is None or s.buffer is None or s.buffer.usage != BufferUsage.WEIGHTS:
                    continue
                sb = self._backend_from_buffer(s, t)
                if (self.op_offload and sb == len(self.backends) - 1 and s.buffer.is_host()):
                    for i, b in enumerate(self.backends[:-1]):
                        if self._op_ok(i, t):
                            off = bool(b.offload_op(t))
                            # (recorded: a split template replays only with the same answers)
                            a.offload_asked.append((t, i, off))
                            if off:
                                return i, "1.off"
                return sb, "1.wgt"
        return -1, ""

    def buffer_supported(self, bo: dict[Tensor, int], t: Tensor, b: int) -> bool:
        """Whether backend ``b`` can use the memory ``t`` has or will have (its buffer's, else
        the compute buffer type of the backend ``bo`` assigns it or its ``view_src``); False
        while neither is known."""
        buf = t.buffer if t.buffer is not None else (t.view_src.buffer if t.view_src is not None else None)
        if buf is not None:
            buft = buf.buft
        else:
            bid = _bid(bo, t)
            if bid < 0 and t.view_src is not None:
                bid = _bid(bo, t.view_src)
            if bid < 0:
                return False
            buft = self.bufts[bid]
        return self._buft_ok(b, buft)

    def _pass1_assign_preallocated(self, a: Assignment, graph: Graph) -> None:
        """Pass 1 of ``ggml_backend_sched_split_graph``: assign backends to ops with pre-allocated
        inputs. Leafs and nodes that have memory (or whose ``view_src`` has) go to the backend of
        that buffer (``1.dst``, ``1.vsrc``); user inputs to the CPU (``1.inp``); an op reading
        weights goes to the weights' backend (``1.wgt``) or, when offloading, to a higher-priority
        backend that wants it (``1.off``). Existing assignments stay.

        Raises:
            UnsupportedOpError: a pre-allocated tensor is in a buffer no capable backend can use.
        """
        bo, cause = a.backend_of, a.cause
        # a placed op NONE tensor goes by its buffer type alone when every backend runs op NONE
        # (_backend_from_buffer's first case, written out: most leafs are weights)
        by_buft = self._bid_of_buft.get if None not in self._op_tokens else None
        none = Op.NONE
        for leaf in graph._leafs:
            if bo.get(leaf, -1) < 0:
                buf = leaf._buffer
                if by_buft is not None and buf is not None and leaf.op is none:
                    b = by_buft(buf.buft, -1)
                    if b >= 0:
                        bo[leaf] = b
                        cause[leaf] = "1.dst"
                        continue
                b, c = self._backend_id_from_cur(a, leaf)
                if b >= 0:
                    bo[leaf], cause[leaf] = b, c
        weights = BufferUsage.WEIGHTS
        offload = self.op_offload
        for node in graph._nodes:
            if bo.get(node, -1) >= 0:
                continue
            vs = node.view_src
            if (node._buffer is None and (vs is None or vs._buffer is None)
                    and not _int_and(node.flags, _INPUT)):
                # only the weights rule can apply: skip nodes that read no weights (cheaply)
                for s in node.src:
                    if s is not None and s._buffer is not None and s._buffer.usage == weights:
                        break
                else:
                    continue
                if not offload and node.op not in _NO_WEIGHTS_RULE:
                    # (the weights rule of _backend_id_from_cur written out: s is the first
                    # source in a weights buffer)
                    b = self._backend_from_buffer(s, node)
                    if b >= 0:
                        bo[node] = b
                        cause[node] = "1.wgt"
                    continue
            b, c = self._backend_id_from_cur(a, node)
            if b >= 0:
                bo[node], cause[node] = b, c


    def _pass2_expand_assignments(self, a: Assignment, compute_nodes: list[Tensor]) -> None:
        """Pass 2 of ``ggml_backend_sched_split_graph``: expand current backend assignments to
        unassigned neighbours, in four sweeps: non-CPU backends down then up, then every backend
        down then up (cause ``2.gpu_down``, ``2.gpu_up``, ``2.down``, ``2.up``). A node only takes
        a backend that supports it."""
        bo, cause = a.backend_of, a.cause
        bo_get = bo.get
        memo_get = self._op_memo.get
        op_ok = self._op_ok
        cpu = len(self.backends) - 1
        for forward, skip_cpu, tag in ((True, True, "2.gpu_down"), (False, True, "2.gpu_up"),
                                       (True, False, "2.down"), (False, False, "2.up")):
            cur = -1
            left = 0  # nodes this sweep left unassigned
            for node in (compute_nodes if forward else reversed(compute_nodes)):
                b = bo_get(node, -1)
                if b >= 0:
                    cur = -1 if (skip_cpu and b == cpu) else b
                    continue
                if cur >= 0:
                    ok = memo_get(id(node) << 4 | cur)  # (_op_ok's memo read inline)
                    if ok is None:
                        ok = op_ok(cur, node)
                    if ok:
                        bo[node] = cur
                        cause[node] = tag
                        continue
                left += 1
            if not left:
                break  # every node has a backend: the later sweeps would change nothing


    def _pass3_upgrade_to_higher_prio(self, a: Assignment, compute_nodes: list[Tensor]) -> None:
        """Pass 3 of ``ggml_backend_sched_split_graph``: upgrade nodes to higher-priority backends
        with compatible buffer types (cause ``3.upg``), and give each still-unassigned node the
        backend that supports it and can use the most of its already-placed sources (``3.best``)."""
        bo, cause = a.backend_of, a.cause
        bufts = self.bufts
        # per backend b: the higher-priority backends i < b with the same buffer type (the only
        # upgrade candidates; usually none)
        lower = [[i for i in range(b) if bufts[i] is bufts[b]] for b in range(len(bufts))]
        bo_get = bo.get
        for node in compute_nodes:
            b = bo_get(node, -1)
            if b >= 0 and not lower[b]:
                continue
            srcs = [s for s in node.src if s is not None]
            if b < 0:
                best = -1
                for i in range(len(self.backends)):
                    if self._op_ok(i, node):
                        n_sup = sum(1 for s in srcs
                                    if (_bid(bo, s) >= 0 or _bid(bo, s.view_src) >= 0)
                                    and self.buffer_supported(bo, s, i))
                        if n_sup > best:
                            best = n_sup
                            bo[node], cause[node] = i, "3.best"
            else:
                for i in lower[b]:
                    if (self._op_ok(i, node)
                            and all(self.buffer_supported(bo, s, i) for s in srcs)):
                        bo[node], cause[node] = i, "3.upg"
                        break


    def _view_src_buft(self, bo: dict[Tensor, int], vs: Tensor) -> BufferType | None:
        """The buffer type ``vs``'s memory will be in: its buffer's, else the compute buffer type
        of the backend it is assigned to; None while neither is known."""
        if vs.buffer is not None:
            return vs.buffer.buft
        vb = bo.get(vs, -1)
        return None if vb < 0 else self.bufts[vb]

    def _pass3b_inplace_writers_follow_memory(self, a: Assignment,
                                              compute_nodes: list[Tensor]) -> None:
        """After pass 3 (not in the seed; ggml's open bug): a node that is not a view op but has a
        ``view_src`` (an in-place writer such as ``add_inplace``, ``set_1d_inplace``,
        ``acc_inplace``, ``sqr_inplace``) writes into its ``view_src``'s memory, so it must run
        on a backend that can access that memory. When its current backend cannot, it moves to
        the backend that owns the memory (``3.inpl``), or else to the first backend able to
        access it and run the op; its other sources are then copied in by pass 5.

        Raises:
            UnsupportedOpError: no backend that can access the memory runs the op, or the user
                pinned the writer to a backend that cannot access it (at split time, never at
                compute time).
        """
        bo, cause = a.backend_of, a.cause
        for node in compute_nodes:
            vs = node.view_src
            if vs is None:
                continue
            buft = self._view_src_buft(bo, vs)
            b = bo.get(node, -1)
            if buft is None or (b >= 0 and self._buft_ok(b, buft)):
                continue
            if b >= 0 and cause.get(node) == "usr":
                raise UnsupportedOpError(
                    f"Scheduler: node '{node.name}' ({node.op.name}) is pinned to "
                    f"{self.backends[b].name} but writes in place into '{vs.name}', whose memory "
                    f"is in a {buft.name} buffer that {self.backends[b].name} cannot access")
            vb = bo.get(vs, -1)
            order = ([vb] if vb >= 0 else []) + [i for i in range(len(self.backends)) if i != vb]
            for i in order:
                if self._buft_ok(i, buft) and self._op_ok(i, node):
                    bo[node], cause[node] = i, "3.inpl"
                    break
            else:
                raise UnsupportedOpError(
                    f"Scheduler: node '{node.name}' ({node.op.name}) writes in place into "
                    f"'{vs.name}', whose memory is in a {buft.name} buffer, and no backend that "
                    f"can access that buffer supports the op (backends: "
                    f"{', '.join(be.name for be in self.backends)})")

    def _pass4_assign_remaining_srcs(self, a: Assignment, nodes: list[Tensor]) -> None:
        """Pass 4 of ``ggml_backend_sched_split_graph``: assign backends to remaining sources from
        their destination and view sources (``4.vsrc``, ``4.cur``); a node still unassigned takes
        the first backend that supports it (``4.fallback``).

        Raises:
            UnsupportedOpError: no backend supports a node's op.
        """
        bo, cause = a.backend_of, a.cause
        for node in nodes:
            if node.view_src is not None and bo.get(node, -1) < 0:
                vb = bo.get(node.view_src, -1)
                if vb >= 0:
                    bo[node], cause[node] = vb, "4.vsrc"
            if bo.get(node, -1) < 0:
                for i in range(len(self.backends)):
                    if self._op_ok(i, node):
                        bo[node], cause[node] = i, "4.fallback"
                        break
                else:
                    srcs = ", ".join(f"{s.name}:{s.type.type_name}" for s in node.src if s is not None)
                    raise UnsupportedOpError(
                        f"Scheduler: no backend supports op {node.op.name} of node '{node.name}' "
                        f"({node.type.type_name}, sources {srcs}); backends: "
                        f"{', '.join(b.name for b in self.backends)}")
            nb_ = bo[node]
            for s in node.src:
                if s is None or bo.get(s, -1) >= 0:
                    continue
                if s.view_src is not None:
                    vb = bo.get(s.view_src, -1)
                    if vb < 0:
                        vb = nb_
                        bo[s.view_src], cause[s.view_src] = nb_, "4.cur"
                    bo[s], cause[s] = vb, "4.vsrc"
                else:
                    bo[s], cause[s] = nb_, "4.cur"


    def _check_view_src_access(self, a: Assignment, nodes: list[Tensor]) -> None:
        """After pass 4: a node that writes into its ``view_src``'s memory (not a view op) must
        be on a backend that can access that memory: the ``view_src``'s buffer, or the compute
        buffer of the backend the ``view_src`` is assigned to.

        Raises:
            UnsupportedOpError: a non-view node writes into a view of a tensor in a buffer its
                backend cannot use (found at split time, never at compute time).
        """
        bo = a.backend_of
        for node in nodes:
            vs = node.view_src
            if vs is None or node.op in VIEW_OPS or node.op == Op.NONE:
                continue
            buft = self._view_src_buft(bo, vs)
            b = bo[node]
            if buft is not None and not self._buft_ok(b, buft):
                where = vs.buffer.name if vs.buffer is not None else buft.name
                raise UnsupportedOpError(
                    f"Scheduler: node '{node.name}' ({node.op.name}) writes into a view of "
                    f"'{vs.name}' in a {where} buffer that its backend {self.backends[b].name} "
                    "cannot access")
