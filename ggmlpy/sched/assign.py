"""The seed's backend-assignment passes 1-4 of ``ggml_backend_sched_split_graph`` (and the
in-place-writer rule between passes 3 and 4), as a mixin of :class:`~ggmlpy.sched.scheduler.Scheduler`.

They read and write the scheduler's ``_backend_of`` (tensor -> backend index) and ``_cause``
(tensor -> the rule that placed it, see ``Scheduler.report``). ``supports_op`` answers are asked
once per (node, backend) per split and ``supports_buft`` answers once per (backend, buffer type)
for the scheduler's life (``_op_memo``, ``_buft_memo``).
"""

from __future__ import annotations

from typing import Any

from ggmlpy.backend.interface import Backend, BufferType, BufferUsage
from ggmlpy.core.errors import UnsupportedOpError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import VIEW_OPS, Op
from ggmlpy.core.tensor import Flag, Tensor

__all__ = ["AssignPasses", "node_key", "op_memo_token", "OP_KEY_MEMO_SIZE"]

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


class AssignPasses:
    """Passes 1-4 of the seed's split (a mixin: the scheduler provides ``backends``, ``bufts``,
    ``op_offload``, ``_backend_of``, ``_cause``, ``_op_memo``, ``_buft_memo`` and
    ``_offload_asked``, where pass 1 records every ``offload_op`` answer it used)."""

    backends: list[Backend]
    bufts: list[BufferType]
    op_offload: bool
    _backend_of: dict[Tensor, int]
    _cause: dict[Tensor, str]
    _op_memo: dict[int, bool]  # id(node) << 4 | backend index
    _op_key_memo: dict[tuple, bool]
    _op_tokens: list[Any]
    _bid_of_buft: dict[BufferType, int]
    _buft_memo: dict[tuple[int, BufferType], bool]
    _offload_asked: list[tuple[Tensor, int, bool]]  # offload_op answers of the current split

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

    def _bid(self, t: Tensor | None) -> int:
        return -1 if t is None else self._backend_of.get(t, -1)

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

    def _backend_id_from_cur(self, t: Tensor) -> tuple[int, str]:
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
                            self._offload_asked.append((t, i, off))
                            if off:
                                return i, "1.off"
                return sb, "1.wgt"
        return -1, ""

    def _set_if_supported(self, node: Tensor, b: int, cause: str) -> None:
        if self._op_ok(b, node):
            self._backend_of[node] = b
            self._cause[node] = cause

    def _buffer_supported(self, t: Tensor, b: int) -> bool:
        buf = t.buffer if t.buffer is not None else (t.view_src.buffer if t.view_src is not None else None)
        if buf is not None:
            buft = buf.buft
        else:
            bid = self._bid(t)
            if bid < 0 and t.view_src is not None:
                bid = self._bid(t.view_src)
            if bid < 0:
                return False
            buft = self.bufts[bid]
        return self._buft_ok(b, buft)

    def _pass1_assign_preallocated(self, graph: Graph) -> None:
        """Pass 1 of ``ggml_backend_sched_split_graph``: assign backends to ops with pre-allocated
        inputs. Leafs and nodes that have memory (or whose ``view_src`` has) go to the backend of
        that buffer (``1.dst``, ``1.vsrc``); user inputs to the CPU (``1.inp``); an op reading
        weights goes to the weights' backend (``1.wgt``) or, when offloading, to a higher-priority
        backend that wants it (``1.off``). Existing assignments stay.

        Raises:
            UnsupportedOpError: a pre-allocated tensor is in a buffer no capable backend can use.
        """
        bo, cause = self._backend_of, self._cause
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
                b, c = self._backend_id_from_cur(leaf)
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
            b, c = self._backend_id_from_cur(node)
            if b >= 0:
                bo[node], cause[node] = b, c


    def _pass2_expand_assignments(self, compute_nodes: list[Tensor]) -> None:
        """Pass 2 of ``ggml_backend_sched_split_graph``: expand current backend assignments to
        unassigned neighbours, in four sweeps: non-CPU backends down then up, then every backend
        down then up (cause ``2.gpu_down``, ``2.gpu_up``, ``2.down``, ``2.up``). A node only takes
        a backend that supports it."""
        bo, cause = self._backend_of, self._cause
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
                    ok = memo_get(id(node) << 4 | cur)  # (_set_if_supported written out)
                    if ok is None:
                        ok = op_ok(cur, node)
                    if ok:
                        bo[node] = cur
                        cause[node] = tag
                        continue
                left += 1
            if not left:
                break  # every node has a backend: the later sweeps would change nothing


    def _pass3_upgrade_to_higher_prio(self, compute_nodes: list[Tensor]) -> None:
        """Pass 3 of ``ggml_backend_sched_split_graph``: upgrade nodes to higher-priority backends
        with compatible buffer types (cause ``3.upg``), and give each still-unassigned node the
        backend that supports it and can use the most of its already-placed sources (``3.best``)."""
        bo, cause = self._backend_of, self._cause
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
                                    if (self._bid(s) >= 0 or self._bid(s.view_src) >= 0)
                                    and self._buffer_supported(s, i))
                        if n_sup > best:
                            best = n_sup
                            bo[node], cause[node] = i, "3.best"
            else:
                for i in lower[b]:
                    if (self._op_ok(i, node)
                            and all(self._buffer_supported(s, i) for s in srcs)):
                        bo[node], cause[node] = i, "3.upg"
                        break


    def _view_src_buft(self, vs: Tensor) -> BufferType | None:
        """The buffer type ``vs``'s memory will be in: its buffer's, else the compute buffer type
        of the backend it is assigned to; None while neither is known."""
        if vs.buffer is not None:
            return vs.buffer.buft
        vb = self._backend_of.get(vs, -1)
        return None if vb < 0 else self.bufts[vb]

    def _pass3b_inplace_writers_follow_memory(self, compute_nodes: list[Tensor]) -> None:
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
        bo, cause = self._backend_of, self._cause
        for node in compute_nodes:
            vs = node.view_src
            if vs is None:
                continue
            buft = self._view_src_buft(vs)
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

    def _pass4_assign_remaining_srcs(self, nodes: list[Tensor]) -> None:
        """Pass 4 of ``ggml_backend_sched_split_graph``: assign backends to remaining sources from
        their destination and view sources (``4.vsrc``, ``4.cur``); a node still unassigned takes
        the first backend that supports it (``4.fallback``).

        Raises:
            UnsupportedOpError: no backend supports a node's op.
        """
        bo, cause = self._backend_of, self._cause
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


    def _check_view_src_access(self, nodes: list[Tensor]) -> None:
        """After pass 4: a node that writes into its ``view_src``'s memory (not a view op) must
        be on a backend that can access that memory: the ``view_src``'s buffer, or the compute
        buffer of the backend the ``view_src`` is assigned to.

        Raises:
            UnsupportedOpError: a non-view node writes into a view of a tensor in a buffer its
                backend cannot use (found at split time, never at compute time).
        """
        bo = self._backend_of
        for node in nodes:
            vs = node.view_src
            if vs is None or node.op in VIEW_OPS or node.op == Op.NONE:
                continue
            buft = self._view_src_buft(vs)
            b = bo[node]
            if buft is not None and not self._buft_ok(b, buft):
                where = vs.buffer.name if vs.buffer is not None else buft.name
                raise UnsupportedOpError(
                    f"Scheduler: node '{node.name}' ({node.op.name}) writes into a view of "
                    f"'{vs.name}' in a {where} buffer that its backend {self.backends[b].name} "
                    "cannot access")
